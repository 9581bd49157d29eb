"""Issue 23, attacks 5 and 12 (hostfiles): every host passes one check, big or foreign inputs get
one line. A real second user (tests/hostile.py) writes the host lists root is given (a hostfile,
a config, a file of names for the command line) and ssh configs; root runs the real commands:
no command hidden in a host name runs (no marker file; nothing written in the folder root runs
in), the answer is one exact line and exit 2, and a 100,000-line hostfile or a FIFO in its place
is refused in one line within seconds. A host that could be an injection is refused before any
ssh config is read: root's own ssh config with a `Match exec` (paramiko puts the host into it as
%h and runs it through a shell) is the witness, and a config another user owns or could change
is refused too. The Slurm part (attack 13) needs a real Slurm: tests/lab/test_hostile_hosts.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ddp_preflight.transport import NodeError, SshNode
from tests.hostile import hostile_user

ROOT = Path(__file__).resolve().parents[2]
MAX_HOSTS = 4096        # the documented cap (docs/security.md); transport.host_names.MAX_HOSTS
FIX = "give an ssh alias, a DNS name or an address"

# Host names that would run a command (or read as an option, or expand a token) if they reached
# a shell or ssh's command line, with the characters the one line names.
HOSTILE = [
    ("x$(id>f)", "('$', '(', '>', ')')"),
    ("x`id>f`", "('`', '>')"),
    ("x;id>f", "(';', '>')"),
    ("x|id>f", "('|', '>')"),
    ("x&&id>f", "('&', '>')"),
    ("%d$(id>f)", "('%', '$', '(', '>', ')')"),
    ("x'$(id>f)'", "(\"'\", '$', '(', '>', ')')"),
    ("x\nid>f", "('\\n', '>')"),
    ("worker1\n", "('\\n')"),
    ("x y", "(' ')"),
    ("x\x1b]0;owned\x07", "('\\x1b', ';', '\\x07')"),
]


def command(*args: str) -> list[str]:
    """The `ddp-preflight` / `hangwatch` console scripts' own two lines, for this checkout (-P: the
    tool imports nothing from the folder it runs in)."""
    module, rest = args[0], args[1:]
    return [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            f"from ddp_preflight.cli.{module} import main; sys.exit(main())", *rest]


def run(*args: str, cwd: Path, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("SLURM_") and k != "DDP_PREFLIGHT_SSH_CONFIG"}
    return subprocess.run(command(*args), capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**base, **(env or {})})


def one_line(done: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints, after checking it is one: exit 2, nothing on stdout."""
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert done.stderr.count("\n") == 1 and done.stderr.endswith("\n"), done.stderr[-3000:]
    assert "\x1b" not in done.stderr and "Traceback" not in done.stderr
    return done.stderr[:-1]


@pytest.fixture
def user():
    return hostile_user()


@pytest.fixture
def shared(user):
    """A folder of the intruder's own, made by that user in its home, where root runs the tools
    (so `id>f` would land there); removed after the test."""
    folder = user.home / f"hosts-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "755", str(folder)])
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def plant(user, path: Path, text: str, mode: str = "644") -> Path:
    """The intruder writes `path` itself."""
    user.run(["sh", "-c", 'cat > "$1" && chmod "$2" "$1"', "sh", str(path), mode], input=text)
    return path


@pytest.fixture
def witness(tmp_path):
    """Root's own ssh config (root's folder, 0644): a `Match exec` that paramiko runs through a
    shell with the host as %h, as many real configs do (`Match exec "test %h = ..."`)."""
    path = tmp_path / "ssh_config"
    path.write_text('Match exec "test %h = never-this-host"\n  User root\n')
    return path


def nothing_written(folder: Path, before: set[str]) -> None:
    assert set(os.listdir(folder)) == before, sorted(set(os.listdir(folder)) - before)


# --- hangwatch attach: the attack as it was (issue 23, attack 5) -----------------------------------

@pytest.mark.parametrize("host,chars", HOSTILE)
def test_hangwatch_attach_refuses_a_host_that_would_run_through_match_exec(user, shared, witness, host, chars):
    names = plant(user, shared / "hosts.txt", host)           # root runs: hangwatch attach $(cat hosts.txt)
    before = set(os.listdir(shared))
    done = run("hangwatch", "attach", "--ssh-config", str(witness), "--for", "1", names.read_text(), cwd=shared)

    assert one_line(done) == (f"hangwatch: error: the command line: host name {host!r} has characters that are "
                              f"not part of a host name {chars}; {FIX}")
    nothing_written(shared, before)


def test_hangwatch_attach_refuses_a_host_that_ssh_would_read_as_an_option(user, shared, witness):
    host = f"-oProxyCommand=id>{shared}/f"
    done = run("hangwatch", "attach", "--ssh-config", str(witness), "--for", "1", "--", host, cwd=shared)

    assert one_line(done) == (f"hangwatch: error: the command line: host name {host!r} starts with '-', which "
                              f"ssh and srun would read as an option; {FIX}")
    assert not (shared / "f").exists()


def test_a_good_host_still_reaches_the_ssh_config(tmp_path, shared):
    # The witness works: the same Match exec runs for a host that passes (so the refusals above
    # are what stopped the attack), and the host then fails as an unknown name does.
    config = tmp_path / "ssh_config"
    config.write_text(f'Match exec "touch {tmp_path}/read-%h"\n  User root\n')
    done = run("hangwatch", "attach", "--ssh-config", str(config), "--for", "1", "nosuch.invalid", cwd=shared)

    assert (tmp_path / "read-nosuch.invalid").exists()
    assert done.returncode == 2 and "does not resolve" in done.stderr, done.stderr


# --- ddp-preflight: the command line, --hostfile and --config --------------------------------------

@pytest.mark.parametrize("host,chars", HOSTILE[:3] + HOSTILE[5:6] + HOSTILE[8:9])
def test_ddp_preflight_refuses_a_hostile_host_on_the_command_line(user, shared, witness, host, chars):
    before = set(os.listdir(shared))
    done = run("ddp_preflight", "--ssh-config", str(witness), "--json", "master", host, cwd=shared)

    assert one_line(done) == (f"ddp-preflight: error: the command line: host name {host!r} has characters that "
                              f"are not part of a host name {chars}; {FIX}")
    nothing_written(shared, before)


@pytest.mark.parametrize("line,host,reason", [
    ("x$(id>f) slots=2", "x$(id>f)", "has characters that are not part of a host name ('$', '(', '>', ')')"),
    ("x`id>f`:2", "x`id>f`", "has characters that are not part of a host name ('`', '>')"),
    ("%h%d slots=2", "%h%d", "has characters that are not part of a host name ('%')"),
    ("-oProxyCommand=id>f slots=2", "-oProxyCommand=id>f", "starts with '-', which ssh and srun would read as an option"),
    ("root@-x slots=2", "root@-x", "is not a host name, an address or user@host"),
])
def test_ddp_preflight_refuses_a_hostile_hostfile_line(user, shared, witness, line, host, reason):
    hostfile = plant(user, shared / "hostfile", f"master slots=2\n{line}\n")
    before = set(os.listdir(shared))
    done = run("ddp_preflight", "--ssh-config", str(witness), "--hostfile", str(hostfile), cwd=shared)

    assert one_line(done) == f"ddp-preflight: error: hostfile {hostfile} line 2: host name {host!r} {reason}; {FIX}"
    nothing_written(shared, before)


@pytest.mark.parametrize("host,chars", [("x$(id>f)", "('$', '(', '>', ')')"), ("worker1\nid>f", "('\\n', '>')")])
def test_ddp_preflight_refuses_a_hostile_host_in_the_config(user, shared, witness, host, chars, tmp_path):
    escaped = host.replace("\n", "\\n")
    # Root's own config (one of the intruder's is refused whole: test_hostile_code.py), naming the host.
    config = tmp_path / "cluster.toml"
    config.write_text(f'hosts = ["master", "{escaped}"]\n')
    before = set(os.listdir(shared))
    done = run("ddp_preflight", "--ssh-config", str(witness), "--config", str(config), cwd=shared)

    assert one_line(done) == (f"ddp-preflight: error: config {config} (hosts): host name {host!r} has characters "
                              f"that are not part of a host name {chars}; {FIX}")
    nothing_written(shared, before)


# --- big and foreign host lists (issue 23, attack 12) -----------------------------------------------

def test_a_100000_line_hostfile_is_one_line_within_seconds(user, shared):
    hostfile = plant(user, shared / "hostfile", "".join(f"node{i:06d} slots=8\n" for i in range(100_000)))
    assert hostfile.stat().st_size == 1_900_000
    started = time.monotonic()
    done = run("ddp_preflight", "--hostfile", str(hostfile), "--json", cwd=shared, timeout=120)

    assert time.monotonic() - started < 10
    assert one_line(done) == (f"ddp-preflight: error: hostfile {hostfile} is not read: over 1 MiB (1.8 MiB); "
                              f"give a regular file of one 'host slots=N' per line, at most {MAX_HOSTS} hosts and 1 MiB")


def test_a_hostfile_of_more_hosts_than_the_cap_names_the_first_line_over_it(user, shared):
    hostfile = plant(user, shared / "hostfile", "# the cluster\n" + "".join(f"n{i}\n" for i in range(5000)))
    done = run("ddp_preflight", "--hostfile", str(hostfile), "--json", cwd=shared)

    assert one_line(done) == (f"ddp-preflight: error: hostfile {hostfile} lists more than the {MAX_HOSTS} hosts "
                              f"ddp-preflight takes (line {MAX_HOSTS + 2} is host {MAX_HOSTS + 1}); "
                              "give the hosts of one run")


def test_a_fifo_in_place_of_the_hostfile_is_refused_at_once(user, shared):
    fifo = shared / "hostfile"
    user.run(["mkfifo", "-m", "666", str(fifo)])      # nobody ever writes to it
    done = run("ddp_preflight", "--hostfile", str(fifo), "--json", cwd=shared, timeout=30)

    assert one_line(done) == (f"ddp-preflight: error: hostfile {fifo} is not read: a FIFO, not a regular file; "
                              f"give a regular file of one 'host slots=N' per line, at most {MAX_HOSTS} hosts and 1 MiB")


@pytest.mark.parametrize("tool", ["ddp_preflight", "hangwatch"])
def test_more_hosts_than_the_cap_on_the_command_line_or_in_the_config_is_one_line(user, shared, tool, tmp_path):
    hosts = [f"n{i}" for i in range(MAX_HOSTS + 1)]
    if tool == "hangwatch":
        done = run("hangwatch", "attach", "--for", "1", *hosts, cwd=shared)
        origin = "the command line"
    else:
        config = tmp_path / "cluster.toml"        # root's own: one of the intruder's is refused whole
        config.write_text("hosts = [" + ", ".join(f'"{h}"' for h in hosts) + "]\n")
        done = run("ddp_preflight", "--config", str(config), "--json", cwd=shared)
        origin = f"config {config} (hosts)"

    prog = tool.replace("_", "-")
    assert one_line(done) == (f"{prog}: error: {origin} lists {MAX_HOSTS + 1} hosts, more than the {MAX_HOSTS} "
                              "ddp-preflight takes; give the hosts of one run")


# --- an ssh config another user could write (its Match exec would run as root) -----------------------

def intruders_config(user, shared) -> Path:
    return plant(user, shared / "ssh_config", f'Match exec "id > {shared}/pwned"\n  User root\n')


@pytest.mark.parametrize("how", ["--ssh-config", "DDP_PREFLIGHT_SSH_CONFIG"])
def test_an_ssh_config_of_another_user_is_refused_and_never_run(user, shared, how):
    config = intruders_config(user, shared)
    if how == "DDP_PREFLIGHT_SSH_CONFIG":
        args, env = (), {how: str(config)}
    else:
        args, env = ("--ssh-config", str(config)), {}
    refusal = (f"ssh config {config} is refused: it belongs to uid {user.uid}, not to root or this user (uid 0), "
               "and an ssh config's Match exec and ProxyCommand run as this user; give a config only root or this "
               "user can change (chown 0 FILE; chmod go-w FILE and its folders)")

    for tool in (("hangwatch", "attach", "--for", "1"), ("ddp_preflight", "--json")):
        done = run(*tool, *args, "nosuch.invalid", cwd=shared, env=env)
        assert one_line(done) == f"{tool[0].replace('_', '-')}: error: {refusal}"
    assert not (shared / "pwned").exists()


def test_an_ssh_config_in_the_home_that_home_names_is_never_read(user, shared):
    """`sudo` keeping the caller's HOME: ~/.ssh/config is the password database's home's, as
    OpenSSH takes it (issue 34), so another user's is neither run nor even refused: not read."""
    config = intruders_config(user, shared)
    dot_ssh = shared / ".ssh"
    user.run(["mkdir", "-m", "700", str(dot_ssh)])
    plant(user, dot_ssh / "config", config.read_text())

    for tool in (("hangwatch", "attach", "--for", "1"), ("ddp_preflight", "--json")):
        done = run(*tool, "nosuch.invalid", cwd=shared, env={"HOME": str(shared)})
        assert "Traceback" not in done.stderr and str(shared) not in done.stderr + done.stdout, done.stderr[-2000:]
    assert not (shared / "pwned").exists()


def test_roots_ssh_config_in_a_folder_another_user_can_write_is_refused(user, shared, tmp_path):
    config = shared / "root-owned-config"
    config.write_text(f'Match exec "id > {tmp_path}/pwned"\n  User root\n')     # root's file, the intruder's folder
    done = run("hangwatch", "attach", "--ssh-config", str(config), "--for", "1", "nosuch.invalid", cwd=tmp_path)

    assert one_line(done) == (f"hangwatch: error: ssh config {config} is refused: {shared} belongs to uid {user.uid}, "
                              "not to root or this user (uid 0), and an ssh config's Match exec and ProxyCommand run "
                              "as this user; give a config only root or this user can change (chown 0 FILE; "
                              "chmod go-w FILE and its folders)")
    assert not (tmp_path / "pwned").exists()


# --- the one check, in the transport too --------------------------------------------------------------

def test_an_ssh_node_made_with_a_hostile_name_never_reads_its_ssh_config(shared, witness):
    # However a node is made (launch, attach, a library caller), the transport checks its name
    # before paramiko expands it into the config's Match exec.
    was = os.getcwd()
    os.chdir(shared)
    try:
        node = SshNode("x$(id>f)", sys.executable, str(witness))
        with pytest.raises(NodeError) as raised:
            node.connect()
    finally:
        os.chdir(was)
    assert raised.value.summary == (f"host name 'x$(id>f)' has characters that are not part of a host name "
                                    f"('$', '(', '>', ')'); {FIX}")
    assert not (shared / "f").exists()


@pytest.mark.parametrize("host", ["worker1", "root@10.0.0.2", "node-1.lan", "[fd00::1]", "fd00::1", "n_1",
                                  "a" * 255])
def test_names_ssh_takes_pass_the_one_check(host):
    from ddp_preflight.transport.host_names import bad_host_reason, check_hosts

    assert bad_host_reason(host) is None
    check_hosts("the command line", [host])


def test_a_long_name_is_quoted_cut_in_its_one_line():
    from ddp_preflight.transport.host_names import HostListError, check_hosts

    with pytest.raises(HostListError) as raised:
        check_hosts("the command line", ["a" * 100_000])
    assert str(raised.value) == (f"the command line: host name {'a' * 60!r}... (100000 characters) is longer than "
                                 f"the 255 characters a host name may have; {FIX}")


def test_the_cap_is_the_documented_one():
    from ddp_preflight.preflight.hosts import MAX_HOSTFILE_BYTES
    from ddp_preflight.transport import host_names

    assert (host_names.MAX_HOSTS, host_names.MAX_NAME, MAX_HOSTFILE_BYTES) == (MAX_HOSTS, 255, 1 << 20)


def test_another_users_slurm_job_is_named_from_its_userid_before_any_srun(user):
    # What scontrol prints as UserId=NAME(UID); the whole refusal, on a real Slurm, is in
    # tests/lab/test_hostile_hosts.py.
    from ddp_preflight.transport.slurm_job import not_yours

    assert not_yours("7", f"root({os.getuid()})") is None
    assert not_yours("7", f"{user.name}({user.uid})") == (
        f"Slurm job 7 belongs to {user.name} (uid {user.uid}), not to root: Slurm runs a step in a job only for its "
        "own user, root too (srun: Unable to create step for job 7: Access/permission denied); give one of your own "
        f"running jobs (squeue --me), or run this as {user.name}")


# --- the red team's variants (issue 23, second round) -----------------------------------------------

def test_roots_ssh_config_with_an_acl_for_the_intruder_is_refused_and_never_run(user, tmp_path):
    """root's file in root's folder, 0644 as `ls` shows it but for its `+`: `setfacl -m
    u:ddpp-intruder:rw`. The intruder adds a Match exec through the ACL; root's run reads none of it."""
    import tempfile

    from tests.acl import grant

    folder = Path(tempfile.mkdtemp(prefix="ddpp-hostile-hosts-"))
    try:
        folder.chmod(0o755)
        config = folder / "ssh_config"
        config.write_text("Host *\n  User root\n")
        grant(config, user.uid, 6)
        user.run(["sh", "-c", f'echo \'Match exec "id > {folder}/pwned"\' >> {config}'])
        mode = f"{config.stat().st_mode & 0o7777:o}"

        done = run("hangwatch", "attach", "--ssh-config", str(config), "--for", "1", "nosuch.invalid", cwd=tmp_path)

        assert one_line(done) == (f"hangwatch: error: ssh config {config} is refused: it is writable by other users "
                                  f"(mode {mode}, with an ACL), and an ssh config's Match exec and ProxyCommand run "
                                  f"as this user; give a config only root or this user can change (setfacl -b {config})")
        assert not (folder / "pwned").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

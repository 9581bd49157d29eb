"""The runner's isolation, the Report's verdicts, the JSON/JUnit/text renderers over the real
faulted report, the TOML config's errors, and host lists (names, hostfiles, Slurm)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ddp_preflight.preflight import config
from ddp_preflight.preflight.checks import BY_ID, CHECKS, FACT_CHECKS, UnknownCheck, run_checks, select
from ddp_preflight.preflight.hosts import HostfileEntry, HostListError, bad_host_reason, read_hostfile
from ddp_preflight.preflight.model import Check, Report, Result, Status
from ddp_preflight.preflight.report import junit, text
from ddp_preflight.transport.slurm_hostlist import expand

from .facts_fixtures import clean, context, faulted

NODES = ("master", "worker1")


def report_of(art: dict, **options) -> Report:
    return Report(tuple(run_checks(context(art, **options), FACT_CHECKS)), NODES)


@pytest.fixture(scope="module")
def faulted_report():
    return report_of(faulted())


@pytest.fixture(scope="module")
def clean_report():
    return report_of(clean(), launch_args=())


# --- the runner --------------------------------------------------------------------------------

def _crash(ctx):
    raise KeyError("gloo_bind")


def test_a_crashing_check_becomes_one_error_and_the_others_still_run():
    crashing = Check("crashes", "raises on any facts", _crash)
    checks = (BY_ID["node-reachable"], crashing, BY_ID["master-port"])

    results = run_checks(context(faulted()), checks)

    errors = [r for r in results if r.check == "crashes"]
    assert len(errors) == 1
    (error,) = errors
    assert (error.status, error.node) == (Status.ERROR, None)
    assert error.summary == "the check failed: KeyError: 'gloo_bind'"
    assert error.fix == "please report this with the --json output"
    assert error.details["at"].startswith("test_runner_and_reports.py:")
    # The checks before and after it still reported, in order.
    assert [r.check for r in results] == ["node-reachable", "node-reachable", "crashes", "master-port"]
    assert [r.status for r in results if r.check == "master-port"] == [Status.FAIL]


def test_select_keeps_the_asked_order_and_rejects_unknown_ids():
    assert select(None) == CHECKS
    assert [c.id for c in select(["ptrace", "master-port"])] == ["ptrace", "master-port"]
    with pytest.raises(UnknownCheck, match="unknown check no-such-check: see --list"):
        select(["ptrace", "no-such-check"])


def test_check_ids_are_unique_and_every_check_has_a_title():
    ids = [c.id for c in CHECKS]
    assert len(ids) == len(set(ids))
    assert all(c.title and "\n" not in c.title for c in CHECKS)


def test_every_check_has_its_docs_page_and_a_row_in_the_checks_table():
    docs = Path(__file__).parents[2] / "docs" / "checks"
    table = (docs / "README.md").read_text()
    for check in CHECKS:
        assert (docs / f"{check.id}.md").read_text().startswith(f"# {check.id}\n"), check.id
        assert f"| [`{check.id}`]({check.id}.md) |" in table, check.id


# --- Report verdicts ---------------------------------------------------------------------------

def _result(status: Status) -> Result:
    return Result("x", status, "master", "s")


@pytest.mark.parametrize("statuses,ok,strict", [
    ((Status.PASS, Status.SKIP), True, True),
    ((Status.PASS, Status.WARN), True, False),
    ((Status.PASS, Status.FAIL), False, False),
    ((Status.ERROR,), False, False),
    ((), True, True),
])
def test_ok_fails_on_fail_or_error_and_ok_strict_also_on_warn(statuses, ok, strict):
    report = Report(tuple(_result(s) for s in statuses))

    assert report.ok is ok
    assert report.ok_strict() is strict


def test_the_recorded_reports_verdicts(clean_report, faulted_report):
    assert clean_report.ok and clean_report.ok_strict()
    assert not faulted_report.ok and not faulted_report.ok_strict()


# --- JSON --------------------------------------------------------------------------------------

def test_json_shape_is_exactly_the_contract(faulted_report):
    document = json.loads(json.dumps(faulted_report.to_json()))

    assert set(document) == {"ok", "nodes", "results"}
    assert document["ok"] is False
    assert document["nodes"] == list(NODES)
    assert len(document["results"]) == len(faulted_report.results)
    for result in document["results"]:
        assert set(result) == {"check", "status", "node", "summary", "fix", "details"}
        assert result["check"] in BY_ID
        assert result["status"] in {"pass", "warn", "fail", "skip", "error"}
        assert result["node"] in (None, *NODES)
        assert isinstance(result["summary"], str) and result["summary"]
        assert result["fix"] is None or isinstance(result["fix"], str)
        assert isinstance(result["details"], dict)


def test_json_keeps_the_details(faulted_report):
    document = faulted_report.to_json()
    shards = next(r for r in document["results"]
                  if (r["check"], r["node"]) == ("data-shards", "worker1"))

    assert shards["status"] == "fail"
    assert shards["details"]["missing_count"] == 4
    assert shards["details"]["differs"] == ["shard_00000.parquet"]


# --- JUnit -------------------------------------------------------------------------------------

def test_junit_has_one_testcase_per_result_and_counts_right(faulted_report):
    root = ET.fromstring(junit.render(faulted_report))
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    counts = {s: sum(r.status is s for r in faulted_report.results) for s in Status}

    assert len(cases) == len(faulted_report.results) == int(suite.get("tests"))
    # The seeded faults; code-parity, the five GPU checks (a CPU run), training-imports on both
    # nodes (the recording predates its facts) and the two Slurm checks (no Slurm job) skip.
    assert counts[Status.FAIL] == 5 and counts[Status.SKIP] == 10
    assert len(suite.findall("testcase/failure")) == counts[Status.FAIL] == int(suite.get("failures"))
    assert len(suite.findall("testcase/error")) == counts[Status.ERROR] == int(suite.get("errors"))
    assert len(suite.findall("testcase/skipped")) == counts[Status.SKIP] == int(suite.get("skipped"))
    names = [c.get("name") for c in cases]
    assert "address-family [worker1]" in names and "code-parity [cluster]" in names
    failure = suite.find("testcase[@name='master-port [master]']/failure")
    assert "PID 16882" in failure.get("message") and "fix: kill 16882" in failure.text


def test_junit_counts_errors_of_an_unreachable_node():
    from .facts_fixtures import unreachable

    report = report_of(unreachable(faulted(), "worker1"))
    suite = ET.fromstring(junit.render(report)).find("testsuite")

    errors = suite.findall("testcase/error")
    assert int(suite.get("errors")) == len(errors) == 1
    assert "connection refused" in errors[0].get("message")


# --- text --------------------------------------------------------------------------------------

def test_text_hides_passes_unless_verbose(clean_report):
    quiet = text.render(clean_report, color=False)
    verbose = text.render(clean_report, color=False, verbose=True)

    assert "torch-parity" not in quiet and "ptrace" not in quiet
    assert "node-reachable" in quiet                 # which nodes were reached always shows
    assert "passes hidden" in quiet
    assert "torch-parity" in verbose and "ptrace" in verbose
    assert "passes hidden" not in verbose
    assert quiet.rstrip().splitlines()[-1].startswith("OK: ")


def test_text_says_not_ready_on_failure_and_shows_the_fix(faulted_report):
    out = text.render(faulted_report, color=False)

    # training-imports skips on both nodes: the recording predates its facts.
    assert "NOT READY: 20 passed, 1 warnings, 5 failed, 0 errors, 10 skipped on 2 node(s)" in out
    # Fixes come below the table, numbered, one per line, so they paste whole.
    fixes = out.split("fixes:\n", 1)[1].splitlines()
    # The leftover holds the master port: master-port and stale-processes offer one kill, said once.
    # It says whose they are (issue 38: a kill fix without its owner).
    assert any(line.strip().endswith("kill 16882   # on master (owned by uid 0), if they are not a run you want; or "
                                     "choose another port with --master-port; seen by master-port, stale-processes")
               and line.strip().split(".", 1)[0].isdigit() for line in fixes)
    assert sum("kill 16882" in line for line in fixes) == 1
    assert "\x1b[" not in out


def test_text_colors_only_when_asked(faulted_report):
    assert "\x1b[" in text.render(faulted_report, color=True)


# --- config ------------------------------------------------------------------------------------

def _one_line_error(path) -> str:
    with pytest.raises(config.ConfigError) as caught:
        config.load(str(path))
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_config_missing_file(tmp_path):
    assert _one_line_error(tmp_path / "nope.toml") == f"config {tmp_path / 'nope.toml'} does not exist"


def test_config_bad_toml(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('backend = "gloo\n')

    assert _one_line_error(path).startswith(f"config {path} is not valid TOML: ")


def test_config_unknown_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('backend = "gloo"\nmaster_prot = 29501\n')

    message = _one_line_error(path)
    assert message.startswith(f"config {path}: unknown key 'master_prot' (known: ")
    assert "master_port" in message


def test_config_unknown_key_under_a_node(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[nodes.worker1]\npython = "/usr/bin/python3"\nbackend = "nccl"\n')

    assert _one_line_error(path) == (f"config {path}: [nodes.worker1] has unknown key 'backend' "
                                     "(per-node keys: code_dir, data_dir, env, python)")


def test_config_nodes_and_hosts_must_have_their_shape(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('nodes = 3\n')
    assert "[nodes] must be a table" in _one_line_error(path)
    path.write_text('hosts = "worker1"\n')
    assert "hosts must be a list" in _one_line_error(path)


def test_config_loads_defaults_and_per_node_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('hosts = ["master", "worker1"]\npython = "/opt/venv/bin/python"\n'
                    '[nodes.worker1]\npython = "/home/me/venv/bin/python"\n')

    loaded = config.load(str(path))
    assert loaded.values["hosts"] == ["master", "worker1"]
    assert loaded.for_node("worker1", "python") == "/home/me/venv/bin/python"
    assert loaded.for_node("master", "python") == "/opt/venv/bin/python"
    assert loaded.for_node("master", "data_dir", "/data") == "/data"
    assert config.load(None) == config.Config()


# --- hosts -------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["a;rm -rf /", "$(x)", "-oProxyCommand=x", "", "worker 1", "`id`"])
def test_bad_host_names_are_rejected(host):
    reason = bad_host_reason(host)

    assert reason is not None and repr(host) in reason


@pytest.mark.parametrize("host", ["worker1", "root@10.0.0.2", "node-1.lan", "[fd00::1]", "fd00::1"])
def test_host_names_ssh_accepts_pass(host):
    assert bad_host_reason(host) is None


def test_hostfile_reads_deepspeed_and_mpich_lines_comments_and_blanks(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# the cluster\n"
                    "master slots=4\n"
                    "\n"
                    "worker1:2   # MPICH style\n"
                    "   worker2\n")

    assert read_hostfile(str(path)) == [HostfileEntry("master", 4), HostfileEntry("worker1", 2),
                                        HostfileEntry("worker2", None)]


@pytest.mark.parametrize("line", ["worker1 slots=four", "worker1:x", "worker1 slots="])
def test_hostfile_bad_slots_name_the_line(tmp_path, line):
    path = tmp_path / "hostfile"
    path.write_text(f"master slots=4\n{line}\n")

    with pytest.raises(HostListError, match=f"hostfile {path} line 2: slots must be a number"):
        read_hostfile(str(path))


def test_hostfile_without_hosts_or_file_is_an_error(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# nothing here\n\n")
    with pytest.raises(HostListError, match="lists no hosts"):
        read_hostfile(str(path))
    with pytest.raises(HostListError, match="No such file"):
        read_hostfile(str(tmp_path / "missing"))


def test_expand_slurm():
    assert expand("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert expand("gpu5") == ["gpu5"]
    # Slurm 22.05 refuses text after an item's last bracket ("Invalid hostlist": recorded in
    # artifacts/slurm/hostnames.json); a number before the text is written out instead.
    with pytest.raises(HostListError, match="'-ib' follows the last"):
        expand("a[9-11]-ib")
    assert expand("a-ib[9-11]") == ["a-ib9", "a-ib10", "a-ib11"]

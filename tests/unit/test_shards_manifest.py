"""The shard manifest over real folders: names, sizes, digests, the cache and the error cases."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ddp_preflight.node.facts import shards
from ddp_preflight.node.facts.shards import DataDirMissing, DataDirUnreadable, manifest

REPO = Path(__file__).resolve().parents[2]


def make_shards(folder: Path, count: int, size: int = 4096) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    contents = {}
    for index in range(count):
        data = os.urandom(size)
        (folder / f"shard_{index:05d}.parquet").write_bytes(data)
        contents[f"shard_{index:05d}.parquet"] = data
    return contents


def test_lists_every_file_with_size_and_blake2b_digest(tmp_path):
    contents = make_shards(tmp_path / "data", 3)
    (tmp_path / "data" / "train").mkdir()
    (tmp_path / "data" / "train" / "part-0.bin").write_bytes(b"rows")
    contents["train/part-0.bin"] = b"rows"

    found = manifest(str(tmp_path / "data"), "blake2b")

    assert found["root"] == str(tmp_path / "data")
    assert found["algorithm"] == "blake2b"
    assert found["files"] == {name: {"size": len(data), "digest": hashlib.blake2b(data).hexdigest()}
                              for name, data in contents.items()}
    assert found["file_count"] == 4
    assert found["total_bytes"] == found["hashed_bytes"] == sum(map(len, contents.values()))
    assert found["cached_files"] == 0


@pytest.mark.parametrize("algorithm", shards.available_algorithms())
def test_each_available_algorithm_matches_its_library(tmp_path, algorithm):
    data = os.urandom(3 * shards.CHUNK + 17)         # several chunks and a short tail
    (tmp_path / "big.bin").write_bytes(data)
    expected = {"blake2b": lambda: hashlib.blake2b(data).hexdigest(),
                "xxh3_128": lambda: __import__("xxhash").xxh3_128(data).hexdigest(),
                "blake3": lambda: __import__("blake3").blake3(data).hexdigest()}[algorithm]()

    found = manifest(str(tmp_path), algorithm)

    assert found["files"]["big.bin"]["digest"] == expected


def test_algorithms_are_in_order_of_preference_and_blake2b_is_always_there():
    assert shards.ALGORITHMS == ("xxh3_128", "blake3", "blake2b")
    available = shards.available_algorithms()
    assert available[-1] == "blake2b"
    assert available == [name for name in shards.ALGORITHMS if name in available]


def facts_zip(folder: Path) -> Path:
    """The node package as the nodes get it: the zip transport/payload.py sends (shards.py reads
    through node/bounded.py, which is in it)."""
    from ddp_preflight.transport.payload import package_zip

    bundle = folder / "node.zip"
    bundle.write_bytes(package_zip())
    bundle.chmod(0o644)
    return bundle


def test_runs_from_a_zip_on_a_bare_python_with_only_blake2b(tmp_path):
    """As on a node: the facts package in a zip, and no site-packages (python -S), so neither
    xxhash nor blake3 nor anything from preflight outside facts can be imported."""
    make_shards(tmp_path / "data", 2)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from ddp_preflight.node.facts import shards; "
            "m = shards.manifest(sys.argv[2], 'blake2b'); "
            "print(json.dumps([shards.available_algorithms(), m['file_count'], "
            "'xxhash' in sys.modules, 'blake3' in sys.modules]))")

    run = subprocess.run([sys.executable, "-S", "-c", code, str(facts_zip(tmp_path)),
                          str(tmp_path / "data")], capture_output=True, text=True, timeout=60)

    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [["blake2b"], 2, False, False]


def test_an_unavailable_algorithm_is_a_shard_error(tmp_path):
    with pytest.raises(shards.ShardError, match="pip install"):
        manifest(str(tmp_path), "md5")


def test_hidden_files_and_folders_are_not_shards(tmp_path):
    make_shards(tmp_path, 1)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "lock").write_text("x")
    (tmp_path / ".DS_Store").write_text("x")

    assert list(manifest(str(tmp_path), "blake2b")["files"]) == ["shard_00000.parquet"]


def test_symlinks_inside_are_followed_loops_and_ways_out_are_skipped(tmp_path):
    data = tmp_path / "data"
    make_shards(data, 1)
    (tmp_path / "elsewhere.bin").write_bytes(b"not ours")
    (data / "out.bin").symlink_to(tmp_path / "elsewhere.bin")
    (data / "alias.parquet").symlink_to(data / "shard_00000.parquet")
    (data / "sub").mkdir()
    (data / "sub" / "up").symlink_to(data)
    (data / "dangling").symlink_to(data / "gone")

    found = manifest(str(data), "blake2b")

    assert sorted(found["files"]) == ["alias.parquet", "shard_00000.parquet"]
    assert found["files"]["alias.parquet"] == found["files"]["shard_00000.parquet"]
    assert found["skipped"] == {"out.bin": "symlink to outside the data folder",
                                "sub/up": "symlink loop", "dangling": "broken symlink"}


def test_an_empty_folder_has_no_files(tmp_path):
    found = manifest(str(tmp_path), "blake2b")
    assert (found["files"], found["file_count"], found["total_bytes"]) == ({}, 0, 0)


def test_a_missing_folder_says_which_and_what_to_do(tmp_path):
    with pytest.raises(DataDirMissing) as caught:
        manifest(str(tmp_path / "nope"), "blake2b")
    message = str(caught.value)
    assert str(tmp_path / "nope") in message and "--data-dir" in message
    assert "\n" not in message


def test_a_file_given_as_the_folder_is_unreadable(tmp_path):
    (tmp_path / "shard.parquet").write_bytes(b"x")
    with pytest.raises(DataDirUnreadable, match="is a file, not a folder"):
        manifest(str(tmp_path / "shard.parquet"), "blake2b")


@pytest.fixture
def shared_tmp():
    """A folder other users can enter (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="shards-test-"))
    folder.chmod(0o755)
    yield folder
    for path in (folder, *folder.rglob("*")):
        path.chmod(0o755)       # so that a non-root user can delete what a test locked
    shutil.rmtree(folder)


def manifest_unprivileged(folder: Path, data_dir: Path) -> subprocess.CompletedProcess:
    """The manifest taken by an unprivileged user, as the training user on a node would. Root
    reads anything, so under root it runs as nobody, with a python3 that nobody may run."""
    as_root = os.geteuid() == 0
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") if as_root else sys.executable
    if python is None:      # scripts/system-deps.sh installs it: this test must run, not skip
        pytest.fail("running as root and no /usr/bin/python3 that nobody may run: apt-get install python3-minimal")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from ddp_preflight.node.facts import shards\n"
            "try:\n    shards.manifest(sys.argv[2], 'blake2b')\n"
            "except shards.ShardError as exc:\n    print(type(exc).__name__, exc)")
    return subprocess.run([python, "-S", "-c", code, str(facts_zip(folder)), str(data_dir)],
                          user=65534 if as_root else None, cwd="/",
                          capture_output=True, text=True, timeout=60)


def test_a_folder_the_user_may_not_list_is_unreadable(shared_tmp):
    data = shared_tmp / "data"
    make_shards(data, 1)
    data.chmod(0)

    run = manifest_unprivileged(shared_tmp, data)

    assert run.stdout.startswith(f"DataDirUnreadable cannot read {data} (Permission denied)"), run
    assert f"chmod -R a+rX {data}" in run.stdout


def test_a_shard_the_user_may_not_read_is_unreadable(shared_tmp):
    data = shared_tmp / "data"
    make_shards(data, 3)
    data.chmod(0o755)
    (data / "shard_00001.parquet").chmod(0)

    run = manifest_unprivileged(shared_tmp, data)

    assert run.stdout.startswith(
        f"DataDirUnreadable cannot read {data / 'shard_00001.parquet'} (Permission denied)"), run


def test_a_rerun_reads_nothing_unchanged_and_rehashes_what_changed(tmp_path):
    contents = make_shards(tmp_path / "data", 3)
    cache = tmp_path / "cache" / "shards.json"
    first = manifest(str(tmp_path / "data"), "blake2b", str(cache))
    assert cache.exists()

    again = manifest(str(tmp_path / "data"), "blake2b", str(cache))
    assert (again["cached_files"], again["hashed_bytes"]) == (3, 0)
    assert again["files"] == first["files"]

    (tmp_path / "data" / "shard_00001.parquet").write_bytes(b"new content")
    changed = manifest(str(tmp_path / "data"), "blake2b", str(cache))
    assert (changed["cached_files"], changed["hashed_bytes"]) == (2, len(b"new content"))
    assert changed["files"]["shard_00001.parquet"]["digest"] == \
        hashlib.blake2b(b"new content").hexdigest()
    assert changed["files"]["shard_00000.parquet"]["digest"] == \
        hashlib.blake2b(contents["shard_00000.parquet"]).hexdigest()


def test_a_cache_hit_does_not_read_the_file(tmp_path):
    """The documented semantics: same path, size, mtime and inode means the cached digest, even if
    the bytes changed behind our back. Proof that the file was not read."""
    shard = tmp_path / "data" / "shard.parquet"
    shard.parent.mkdir()
    shard.write_bytes(b"A" * 1000)
    cache = tmp_path / "shards.json"
    before = manifest(str(shard.parent), "blake2b", str(cache))["files"]["shard.parquet"]
    info = shard.stat()

    with open(shard, "r+b") as stream:          # same inode, same size, other bytes
        stream.write(b"B" * 1000)
    os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns))

    after = manifest(str(shard.parent), "blake2b", str(cache))
    assert after["files"]["shard.parquet"] == before
    assert after["files"]["shard.parquet"]["digest"] != hashlib.blake2b(b"B" * 1000).hexdigest()
    assert after["hashed_bytes"] == 0


def test_the_cache_is_per_algorithm(tmp_path):
    make_shards(tmp_path / "data", 2)
    cache = tmp_path / "shards.json"
    manifest(str(tmp_path / "data"), "blake2b", str(cache))
    other = shards.available_algorithms()[0]
    # xxhash is a dependency and blake3 is in the test extra: a faster algorithm is always there.
    assert other != "blake2b", "only blake2b is installed: pip install xxhash"
    assert manifest(str(tmp_path / "data"), other, str(cache))["cached_files"] == 0


@pytest.mark.parametrize("garbage", [b"{not json", b"[1, 2, 3]", b"\xff\xfe\x00", b""])
def test_a_corrupt_cache_is_ignored_and_replaced(tmp_path, garbage):
    contents = make_shards(tmp_path / "data", 2)
    cache = tmp_path / "shards.json"
    cache.write_bytes(garbage)

    found = manifest(str(tmp_path / "data"), "blake2b", str(cache))

    assert found["files"]["shard_00000.parquet"]["digest"] == \
        hashlib.blake2b(contents["shard_00000.parquet"]).hexdigest()
    assert found["cached_files"] == 0
    assert len(json.loads(cache.read_text())) == 2      # rewritten whole, not appended to
    assert manifest(str(tmp_path / "data"), "blake2b", str(cache))["cached_files"] == 2


def test_a_cache_that_cannot_be_written_is_not_fatal(tmp_path):
    make_shards(tmp_path / "data", 1)
    (tmp_path / "blocker").write_text("a file where the cache folder should be")

    found = manifest(str(tmp_path / "data"), "blake2b", str(tmp_path / "blocker" / "shards.json"))

    assert found["file_count"] == 1


def test_the_cache_forgets_deleted_files(tmp_path):
    make_shards(tmp_path / "data", 3)
    cache = tmp_path / "shards.json"
    manifest(str(tmp_path / "data"), "blake2b", str(cache))
    (tmp_path / "data" / "shard_00002.parquet").unlink()

    manifest(str(tmp_path / "data"), "blake2b", str(cache))

    assert not any("shard_00002" in key for key in json.loads(cache.read_text()))


def test_progress_ends_with_the_totals(tmp_path):
    contents = make_shards(tmp_path, 20, size=100_000)
    calls = []

    manifest(str(tmp_path), "blake2b", progress=lambda *args: calls.append(args))

    total = sum(map(len, contents.values()))
    assert calls[-1] == (total, total, 20, 20)
    assert all(done <= total and files <= 20 for done, _, files, _ in calls)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_progress_counts_cached_files_as_done(tmp_path):
    make_shards(tmp_path / "data", 4, size=1000)
    cache = tmp_path / "shards.json"
    manifest(str(tmp_path / "data"), "blake2b", str(cache))
    calls = []

    manifest(str(tmp_path / "data"), "blake2b", str(cache), progress=lambda *a: calls.append(a))

    assert calls == [(4000, 4000, 4, 4)]


def test_one_thread_and_several_give_the_same_manifest(tmp_path):
    make_shards(tmp_path, 12, size=50_000)
    one = manifest(str(tmp_path), "blake2b", workers=1)
    four = manifest(str(tmp_path), "blake2b", workers=4)
    assert one["files"] == four["files"]


def test_cache_paths_differ_by_folder_and_follow_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    first = shards.default_cache_path(str(tmp_path / "a"))
    second = shards.default_cache_path(str(tmp_path / "b"))

    assert first != second
    assert all(Path(p).parent == tmp_path / "xdg" / "ddp-preflight" for p in (first, second))
    assert os.uname().nodename.split(".")[0] in Path(first).name
    assert shards.default_cache_path(str(tmp_path / "a") + "/") == first


def test_cache_path_without_xdg_is_under_this_users_own_home_whatever_home_says(tmp_path, monkeypatch):
    # Issue 23: HOME may be another user's (sudo keeps it), whose ~/.cache could hold a symlink
    # or a forged cache: the home is this user's own, from the password database.
    import pwd
    own = Path(pwd.getpwuid(os.geteuid()).pw_dir) / ".cache" / "ddp-preflight"
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Path(shards.default_cache_path(str(tmp_path))).parent == own
    # XDG_CACHE_HOME is followed only when HOME is this user's own.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Path(shards.default_cache_path(str(tmp_path))).parent == own

"""The data-shards check over manifests of real folders, as the nodes would send them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddp_preflight.lab.shards import make_dataset, make_mismatched
from ddp_preflight.node.facts.shards import DataDirMissing, ShardError, manifest
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status

DATA_DIR = "/data"


def node(name: str, folder: Path, algorithm: str = "blake2b") -> NodeFacts:
    """A node's facts the way the collector reports them: the manifest, or the error."""
    try:
        section = manifest(str(folder), algorithm)
    except ShardError as exc:
        section = {"error": str(exc), "missing": isinstance(exc, DataDirMissing)}
    return NodeFacts(name, facts={"shards": section})


def run(*nodes: NodeFacts, data_dir: str | None = DATA_DIR, **options):
    results = run_checks(Context(nodes, Options(data_dir=data_dir, **options)), [BY_ID["data-shards"]])
    for result in results:
        json.dumps(result.to_json())            # every result must reach --json as it is
        assert result.check == "data-shards"
    return results


def by_node(results):
    return {r.node: r for r in results}


@pytest.fixture
def dataset(tmp_path):
    """The lab's shards: the master's folder of 8, and a helper to copy it for a worker."""
    master = tmp_path / "master"
    make_dataset(master, 8)

    def copy(name: str) -> Path:
        shutil.copytree(master, tmp_path / name)
        return tmp_path / name
    return master, copy


def test_without_data_dir_it_skips_and_says_how_to_ask():
    (result,) = run(NodeFacts("master"), data_dir=None)
    assert (result.status, result.node) == (Status.SKIP, None)
    assert result.summary == "no --data-dir given"
    assert "--data-dir PATH" in result.fix


def test_identical_folders_pass_on_every_node(dataset):
    master, copy = dataset
    results = by_node(run(node("master", master), node("worker1", copy("w1"))))

    assert {n: r.status for n, r in results.items()} == \
        {"master": Status.PASS, "worker1": Status.PASS}
    assert results["worker1"].summary.startswith("8 shards, ")
    assert results["worker1"].summary.endswith("identical to master")
    assert results["worker1"].details["compared_by"] == "digest"
    assert results["worker1"].fix is None


def test_seed_001_fewer_shards_and_one_altered(dataset, tmp_path):
    master, _ = dataset
    worker = tmp_path / "w1"
    make_mismatched(master, worker, 8)          # the lab's fault: 4 of 8 kept, shard 0 rewritten

    result = by_node(run(node("master", master), node("worker1", worker),
                         master_addr="10.0.0.1"))["worker1"]

    assert result.status is Status.FAIL
    assert result.summary.startswith("worker1 has 4 of the master's 8 shards; 4 missing (")
    assert "1 differs (shard_00000.parquet)" in result.summary
    assert result.details["missing"] == [f"shard_{i:05d}.parquet" for i in range(4, 8)]
    assert (result.details["missing_count"], result.details["differs_count"],
            result.details["extra_count"]) == (4, 1, 0)
    assert result.fix == "run on worker1: rsync -a --delete 10.0.0.1:/data/ /data/"


def test_extra_shards_on_a_worker_fail(dataset):
    master, copy = dataset
    worker = copy("w1")
    (worker / "shard_00099.parquet").write_bytes(b"left over from another run")

    result = by_node(run(node("master", master), node("worker1", worker)))["worker1"]

    assert result.status is Status.FAIL
    assert result.summary == ("worker1 has 8 of the master's 8 shards; "
                              "1 extra (shard_00099.parquet)")
    assert result.details["extra"] == ["shard_00099.parquet"]


def test_changed_content_of_the_same_size_is_found(dataset):
    master, copy = dataset
    worker = copy("w1")
    shard = worker / "shard_00003.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF                # one bit flip: same name, same size
    shard.write_bytes(bytes(data))

    result = by_node(run(node("master", master), node("worker1", worker)))["worker1"]

    assert result.status is Status.FAIL
    assert result.details["differs"] == ["shard_00003.parquet"]
    assert result.details["missing_count"] == result.details["extra_count"] == 0


def test_long_lists_show_five_names_and_a_count(tmp_path):
    master = tmp_path / "master"
    make_dataset(master, 12)
    worker = tmp_path / "w1"
    worker.mkdir()
    shutil.copy(master / "shard_00000.parquet", worker)

    result = by_node(run(node("master", master), node("worker1", worker)))["worker1"]

    assert "11 missing (shard_00001.parquet, shard_00002.parquet, shard_00003.parquet, " \
           "shard_00004.parquet, shard_00005.parquet and 6 more)" in result.summary
    assert len(result.details["missing"]) == 5 and result.details["missing_count"] == 11


def test_each_worker_is_judged_on_its_own(dataset, tmp_path):
    master, copy = dataset
    broken = tmp_path / "w2"
    make_mismatched(master, broken, 8)

    results = by_node(run(node("master", master), node("worker1", copy("w1")),
                          node("worker2", broken)))

    assert results["worker1"].status is Status.PASS
    assert results["worker2"].status is Status.FAIL
    assert "worker2" in results["worker2"].fix


def test_an_empty_master_folder_warns(tmp_path):
    (tmp_path / "empty").mkdir()
    results = by_node(run(node("master", tmp_path / "empty")))
    assert results["master"].status is Status.WARN
    assert "no shards" in results["master"].summary


def test_a_worker_without_the_folder_is_an_error_with_the_copy_command(dataset, tmp_path):
    master, _ = dataset

    result = by_node(run(node("master", master), node("worker1", tmp_path / "missing")))["worker1"]

    assert result.status is Status.ERROR
    assert "does not exist" in result.summary
    assert result.fix == "run on worker1: rsync -a --delete master:/data/ /data/"


def test_a_worker_whose_folder_is_not_a_folder_is_told_to_look_not_to_copy(dataset, tmp_path):
    master, _ = dataset
    (tmp_path / "a-file").write_bytes(b"x")

    result = by_node(run(node("master", master), node("worker1", tmp_path / "a-file")))["worker1"]

    assert result.status is Status.ERROR
    assert "is a file, not a folder" in result.summary
    assert result.fix == "check that /data is the training data folder and readable: ls -la /data"


def test_a_master_that_could_not_list_its_folder_leaves_workers_uncompared(dataset, tmp_path):
    _, copy = dataset
    (tmp_path / "a-file").write_bytes(b"x")

    results = by_node(run(node("master", tmp_path / "a-file"), node("worker1", copy("w1"))))

    assert results["master"].status is Status.ERROR
    assert "is a file, not a folder" in results["master"].summary
    assert results["worker1"].status is Status.SKIP
    assert "master" in results["worker1"].summary


def test_an_unreachable_node_is_skipped_not_compared(dataset):
    master, _ = dataset
    results = by_node(run(node("master", master),
                          NodeFacts("worker1", error="ssh: connect to host worker1 port 22: "
                                                     "Connection refused")))
    assert results["worker1"].status is Status.SKIP
    assert "Connection refused" in results["worker1"].summary


def test_a_node_without_a_manifest_is_an_error(dataset):
    master, _ = dataset
    results = by_node(run(node("master", master), NodeFacts("worker1", facts={})))
    assert results["worker1"].status is Status.ERROR
    assert "no shard manifest" in results["worker1"].summary


def test_different_algorithms_compare_names_and_sizes_and_warn(dataset):
    master, copy = dataset
    worker = copy("w1")
    results = by_node(run(node("master", master, "xxh3_128"), node("worker1", worker, "blake2b")))

    result = results["worker1"]
    assert result.status is Status.WARN
    assert "could not be compared" in result.summary
    assert "xxhash" in result.fix
    assert result.details["compared_by"] == "name+size"


def test_different_algorithms_still_fail_on_missing_shards(dataset):
    master, copy = dataset
    worker = copy("w1")
    (worker / "shard_00007.parquet").unlink()
    shard = worker / "shard_00000.parquet"
    shard.write_bytes(bytes(b ^ 0xFF for b in shard.read_bytes()))     # same size, other bytes

    result = by_node(run(node("master", master, "xxh3_128"),
                         node("worker1", worker, "blake2b")))["worker1"]

    assert result.status is Status.FAIL
    assert result.details["missing"] == ["shard_00007.parquet"]
    # by name and size alone the rewritten shard cannot be told apart: hence the advice to
    # install xxhash everywhere
    assert result.details["differs_count"] == 0
    assert result.details["compared_by"] == "name+size"
    assert result.summary.endswith("content not compared (other hash algorithm)")


def test_paths_with_spaces_are_quoted_in_the_fix(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.bin").write_bytes(b"a")
    (tmp_path / "w").mkdir()

    result = by_node(run(node("master", tmp_path / "m"), node("worker1", tmp_path / "w"),
                         data_dir="/srv/my data"))["worker1"]

    assert result.fix == "run on worker1: rsync -a --delete 'master:/srv/my data/' '/srv/my data/'"


def test_per_node_folders_compare_each_nodes_own_and_the_fix_copies_into_it(dataset, tmp_path):
    # The config gives each node its own folder ([nodes.NAME] data_dir), as the seeds'
    # NANOCHAT_DATA_DIR differs per node: the master's shards in /data/full, worker1's in /scratch/w1.
    master, _ = dataset
    worker = tmp_path / "w1"
    make_mismatched(master, worker, 8)

    results = by_node(run(node("master", master), node("worker1", worker), data_dir="/data/full",
                          data_dirs={"master": "/data/full", "worker1": "/scratch/w1"}, master_addr="10.0.0.1"))

    assert results["master"].details["data_dir"] == "/data/full"
    assert results["worker1"].status is Status.FAIL
    assert results["worker1"].details["data_dir"] == "/scratch/w1"
    assert results["worker1"].fix == "run on worker1: rsync -a --delete 10.0.0.1:/data/full/ /scratch/w1/"


def test_a_missing_per_node_folder_is_named_with_that_nodes_path(dataset, tmp_path):
    master, _ = dataset
    results = by_node(run(node("master", master), node("worker1", tmp_path / "nowhere"), data_dir=None,
                          data_dirs={"master": "/data/full", "worker1": "/scratch/w1"}))

    assert results["worker1"].status is Status.ERROR
    assert results["worker1"].details == {"data_dir": "/scratch/w1"}
    assert results["worker1"].fix == "run on worker1: rsync -a --delete master:/data/full/ /scratch/w1/"

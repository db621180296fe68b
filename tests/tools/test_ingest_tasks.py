"""Ingest as independent tasks (gpupipe.prepare.tasks / engines): the same bytes from one process,
from several, and from a Ray cluster; a job killed anywhere finishes on a rerun with the bytes an
uninterrupted run writes; a task that raises stops the job naming its slice; an unreachable Ray
address is a clear error in seconds."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpupipe.core.errors import ConfigError, GpupipeError
from gpupipe.formats.folder import FOLDER
from gpupipe.prepare import tasks as tasks_module
from gpupipe.prepare.ingest import ingest
from gpupipe.prepare.tasks import PARTS_DIR

IMAGES = 60
SHARD = 5  # 12 tasks


def _folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for i in range(IMAGES):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8 + i % 5, 9, 3), dtype=np.uint8)).save(d / f"im{i:03d}.jpg", quality=90)
    (root / "c1" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xdb\x00\x43" + b"\x00" * 20)  # skipped, listed
    return root


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return _folder(tmp_path_factory.mktemp("ingest-tasks") / "src")


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory) -> dict[str, bytes]:
    """What one uninterrupted run in one process writes."""
    dst = tmp_path_factory.mktemp("reference") / "out"
    report = ingest(str(src), str(dst), shard_size=SHARD, seed=3, val_fraction=0.2, progress=False)
    assert report.tasks >= 12 and report.resumed == 0 and len(report.skipped) == 1
    return _files(dst)


def _files(dst: Path) -> dict[str, bytes]:
    out = {str(p.relative_to(dst)): p.read_bytes() for p in dst.rglob("*") if p.is_file()}
    assert not any(PARTS_DIR in name or ".partial-" in name or name.endswith(".lock") for name in out), sorted(out)
    return out


def test_several_processes_write_the_bytes_one_process_writes(src, reference, tmp_path):
    dst = tmp_path / "out"
    report = ingest(str(src), str(dst), shard_size=SHARD, seed=3, val_fraction=0.2, processes=2, progress=False)
    assert _files(dst) == reference
    from gpupipe.prepare.indexer import index

    # gpupipe index, a shard a task in two processes: the index ingest wrote
    assert index(str(dst / "train"), processes=2, progress=False).to_json().encode() == reference["train/index.json"]
    assert report.tasks >= 12 and len(report.skipped) == 1
    assert "tasks" in report.summary() and "slowest" in report.summary()


_DRIVER = f"""
import sys
from gpupipe.prepare.ingest import ingest
ingest(sys.argv[1], sys.argv[2], shard_size={SHARD}, seed=3, val_fraction=0.2, processes=int(sys.argv[3]), progress=False)
"""


def _parts(dst: Path) -> int:
    folder = dst / PARTS_DIR
    return len([p for p in folder.glob("*.json")]) if folder.is_dir() else 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def _interrupted(src: Path, dst: Path, processes: int, after_parts: int, kill_child: bool) -> int:
    """Start the job in a process; once ``after_parts`` tasks are done, SIGKILL the driver (or one of
    its task processes); its exit status."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(src), str(dst), str(processes)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while proc.poll() is None and _parts(dst) < after_parts and time.monotonic() < deadline:
        time.sleep(0.002)
    if proc.poll() is None:
        victims = _children(proc.pid) if kill_child else []
        os.kill(victims[0] if victims else proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return proc.returncode


@pytest.mark.timeout(240)
def test_a_job_killed_anywhere_finishes_on_a_rerun_with_the_uninterrupted_bytes(src, reference, tmp_path, caplog):
    dst = tmp_path / "out"
    for after in (1, 5):  # the driver killed twice, at two places; each rerun keeps what is done
        _interrupted(src, dst, 1, after, kill_child=False)
    kept = _parts(dst)
    assert 0 < kept < 12 + 3
    report = ingest(str(src), str(dst), shard_size=SHARD, seed=3, val_fraction=0.2, progress=False)
    assert report.resumed == kept and "finished by an interrupted run" in report.summary()
    assert "taking over" in caplog.text  # the dead driver's lock
    assert _files(dst) == reference
    # one task's process killed (two processes): its unfinished tasks run again in new processes, the
    # job finishes with the uninterrupted bytes
    other = tmp_path / "other"
    code = _interrupted(src, other, 2, 2, kill_child=True)
    assert code == 0
    assert _files(other) == reference


def test_parts_of_another_plan_are_not_kept(src, reference, tmp_path, caplog):
    dst = tmp_path / "out"
    _interrupted(src, dst, 1, 3, kill_child=False)
    report = ingest(str(src), str(dst), shard_size=SHARD, seed=4, val_fraction=0.2, progress=False)  # another seed
    assert report.resumed == 0 and "another run" in caplog.text
    again = ingest(str(src), str(tmp_path / "fresh"), shard_size=SHARD, seed=4, val_fraction=0.2, progress=False)
    assert _files(dst) == _files(tmp_path / "fresh") and again.resumed == 0


def test_a_task_that_raises_stops_the_job_naming_its_slice_and_leaves_no_shard_under_its_name(
        src, reference, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    real = tasks_module.object_sample

    def failing(name, *args, **kwargs):
        if name.endswith("im017.jpg"):
            raise GpupipeError("the storage said no")  # not a per-image verdict: the task fails
        return real(name, *args, **kwargs)

    monkeypatch.setattr(tasks_module, "object_sample", failing)
    with pytest.raises(GpupipeError, match=r"ingest task (train|val)/shard-\d{6} \(\d+ inputs of the plan, from .+ to "
                                           r".+\) failed.*the storage said no.*run the same command again"):
        ingest(str(src), str(dst), shard_size=SHARD, seed=3, val_fraction=0.2, progress=False)
    assert not list(dst.rglob("index.json")) and not list(dst.rglob("*.partial-*"))
    assert not (dst / ".gpupipe-ingest.lock").exists()
    monkeypatch.setattr(tasks_module, "object_sample", real)
    ingest(str(src), str(dst), shard_size=SHARD, seed=3, val_fraction=0.2, progress=False)
    assert _files(dst) == reference


def _images_only(src: Path, dst: Path) -> Path:
    """A copy of ``src`` without its broken image (``index --checksums`` reads bytes, it does not decode)."""
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("broken.jpg"))
    return dst


def test_checksums_of_an_image_folder_as_tasks_give_the_index_of_one_process(src, tmp_path, monkeypatch):

    from gpupipe.prepare.indexer import index_in_place

    folder = _images_only(src, tmp_path / "imgs")
    one = index_in_place(str(folder), checksums=True, progress=False)
    assert one is not None and one.objects is not None and one.objects.crc32 is not None
    expected = (folder / "index.json").read_bytes()
    (folder / "index.json").unlink()
    monkeypatch.setattr(FOLDER, "units_per_task", 7)  # 60 images: 9 tasks, the last short
    index_in_place(str(folder), checksums=True, progress=False, processes=2)
    assert (folder / "index.json").read_bytes() == expected
    (folder / "c2" / "im011.jpg").write_bytes(b"other bytes")  # and the checksums are the bytes'
    changed = index_in_place(str(folder), checksums=True, progress=False, processes=2)
    assert changed is not None and changed.objects is not None
    differ = np.flatnonzero(changed.objects.crc32 != one.objects.crc32)
    assert [changed.objects.names[int(i)] for i in differ] == ["c2/im011.jpg"]


def test_an_image_gone_before_its_checksum_task_stops_the_index_naming_the_task(src, tmp_path, monkeypatch):
    from gpupipe.prepare import indexer

    folder = _images_only(src, tmp_path / "imgs")
    real = indexer.resolve

    def resolve_then_lose_one(*args, **kwargs):
        resolved = real(*args, **kwargs)
        (folder / "c1" / "im016.jpg").unlink()  # listed, then gone before it is read
        return resolved

    monkeypatch.setattr(indexer, "resolve", resolve_then_lose_one)
    monkeypatch.setattr(FOLDER, "units_per_task", 10)
    with pytest.raises(GpupipeError, match=r"index task units 20-29 \(from .+c1/im001.jpg to .+\) failed.*im016.jpg: FileNotFoundError"):
        indexer.index_in_place(str(folder), checksums=True, progress=False, processes=2)
    assert not (folder / "index.json").exists()


def test_an_unreachable_ray_address_is_a_clear_error_in_seconds(src, tmp_path, monkeypatch, capsys):
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh process
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"nothing answers at the Ray address 127\.0\.0\.1:1 "):
        ingest(str(src), str(tmp_path / "out"), shard_size=SHARD, engine="ray", ray_address="127.0.0.1:1",
               progress=False)
    assert time.monotonic() - t0 < 10
    from gpupipe.tools.cli import main

    assert main(["ingest", str(src), str(tmp_path / "cli"), "--engine", "ray", "--ray-address", "127.0.0.1:1",
                 "--quiet"]) != 0
    assert "127.0.0.1:1" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown engine 'spark'"):
        ingest(str(src), str(tmp_path / "out"), engine="spark", progress=False)


def _dies_once(context: str, task: int) -> int:
    """A task whose process is killed the first time it runs task 2 (a marker file says so)."""
    marker = Path(context) / f"died-{task}"
    if task == 2 and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return task * task


class _Numbered(int):
    @property
    def name(self) -> str:
        return f"task-{int(self)}"

    def describe(self, context: str) -> str:
        return "a number"


def _dies_always(context: str, task: int) -> int:
    """A task whose process is killed whenever it runs task 1."""
    if task == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return task * task


def test_a_task_whose_process_dies_runs_again_in_a_new_one_and_the_job_gives_up_naming_it(tmp_path, caplog):
    from gpupipe.prepare.engines import Job, run_tasks

    got: dict[int, int] = {}
    run_tasks(Job(_dies_once, str(tmp_path), "test"), [_Numbered(i) for i in range(5)], processes=2,
              on_result=lambda t, r: got.__setitem__(int(t), r))
    assert got == {0: 0, 1: 1, 2: 4, 3: 9, 4: 16} and (tmp_path / "died-2").exists()
    assert "a task's process died" in caplog.text
    with pytest.raises(GpupipeError, match=r"test task task-1 \(a number\) failed, and the job with it: its process "
                                           r"died 4 times"):
        run_tasks(Job(_dies_always, str(tmp_path), "test"), [_Numbered(i) for i in range(3)], processes=2,
                  on_result=lambda t, r: None)


@pytest.mark.timeout(240)
def test_ray_writes_the_bytes_the_local_engine_writes(src, reference, tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             ignore_reinit_error=True)
    try:
        dst = tmp_path / "out"
        report = ingest(str(src), str(dst), shard_size=SHARD, seed=3, val_fraction=0.2, engine="ray", progress=False)
        assert report.tasks >= 12 and len(report.skipped) == 1
        assert _files(dst) == reference
        from gpupipe.prepare.indexer import index

        assert index(str(dst / "val"), engine="ray", progress=False).to_json().encode() == reference["val/index.json"]
        from gpupipe.prepare.indexer import index_in_place

        folder = _images_only(src, tmp_path / "imgs")
        index_in_place(str(folder), checksums=True, progress=False)
        local = (folder / "index.json").read_bytes()
        index_in_place(str(folder), checksums=True, progress=False, engine="ray")
        assert (folder / "index.json").read_bytes() == local and b"crc32" in local
        from gpupipe.tools.validate import validate

        here, there = validate(str(dst / "train"), decode="pil"), validate(str(dst / "train"), decode="pil", engine="ray")
        assert (there.checked, there.problems) == (here.checked, here.problems) and there.checked > 40
        # a task's worker process killed (the OOM killer, a lost node): Ray runs it again, the job goes on
        from ray import cloudpickle

        from gpupipe.prepare.engines import Job, run_tasks

        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test module is not on the workers' path
        got: dict[int, int] = {}
        run_tasks(Job(_dies_once, str(tmp_path), "test"), [_Numbered(i) for i in range(4)], engine="ray",
                  on_result=lambda t, r: got.__setitem__(int(t), r))
        assert got == {0: 0, 1: 1, 2: 4, 3: 9} and (tmp_path / "died-2").exists()
    finally:
        ray.shutdown()


def test_a_source_image_gone_mid_job_is_skipped_and_listed(src, tmp_path, monkeypatch):
    """Listed at the start, deleted before its task reads it: a counted, named skip, not a failed job."""
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(src, copy)
    real = tasks_module.plan_tasks

    def plan_then_delete(*args, **kwargs):
        tasks = real(*args, **kwargs)
        (copy / "c2" / "im005.jpg").unlink()  # after the listing, before any task runs
        return tasks

    monkeypatch.setattr("gpupipe.prepare.ingest.plan_tasks", plan_then_delete)
    report = ingest(str(copy), str(tmp_path / "out"), shard_size=SHARD, progress=False)
    gone = [(p, why) for p, why in report.skipped if p.endswith("im005.jpg")]
    assert len(gone) == 1 and "read failed" in gone[0][1] and report.num_samples == IMAGES - 1


def test_a_destination_that_refuses_writes_is_one_error_naming_it(src, s3_bucket, s3_proxy):
    """Every PUT answered 403 AccessDenied (a bucket the credentials may read, not write)."""
    from s3util import storage_options_via

    from gpupipe.core.errors import StorageError

    proxy = s3_proxy(fault_rate=1.0, faults=("forbidden",), methods=("PUT",))
    options = storage_options_via(proxy, s3_bucket)
    dst = s3_bucket.url("out")
    with pytest.raises(StorageError, match="out") as caught:
        ingest(str(src), dst, shard_size=SHARD, dst_storage_options=options, progress=False)
    assert "AccessDenied" in str(caught.value) or "denied" in str(caught.value).lower() or "403" in str(caught.value)
    assert not s3_bucket.fs().find(f"{s3_bucket.name}/out")  # nothing written

"""Rank, world size and local rank from any launcher's variables (issue 25): before, a process
started by srun or mpirun without ``RANK``/``LOCAL_RANK`` was a single process on local rank 0."""
from __future__ import annotations

import pytest

from gpupipe.core.launch import from_environment
from gpupipe.core.types import World

LAUNCHERS = {
    "torchrun": {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"},
    "srun": {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_STEP_ID": "0"},
    "Open MPI": {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
    "Intel MPI / MPICH": {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1"},
    "PMI": {"PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1"},
}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_each_launcher_gives_rank_world_size_and_local_rank(launcher):
    launch = from_environment(LAUNCHERS[launcher])
    assert (launch.rank, launch.world_size, launch.local_rank) == (5, 8, 1)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_world_detect_reads_them(monkeypatch, launcher):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID",
                 "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
                 "PMI_SIZE", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in LAUNCHERS[launcher].items():
        monkeypatch.setenv(name, value)
    assert World.detect() == World(rank=5, world_size=8, local_rank=1)


def test_torchrun_inside_an_allocation_wins_over_slurm():
    env = {**LAUNCHERS["srun"], "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}
    assert from_environment(env) == from_environment(env).__class__(3, 4, 0, "RANK/WORLD_SIZE", "LOCAL_RANK")


def test_mpirun_inside_a_slurm_allocation_ignores_the_inherited_slurm_values():
    """mpirun starts its ranks through srun: each inherits SLURM_* of mpirun's daemon on its node
    (procid = node, localid 0); only OMPI_COMM_WORLD_* describe the rank."""
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
           "OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}
    launch = from_environment(env)
    assert (launch.rank, launch.world_size, launch.local_rank) == (7, 8, 3)
    assert launch.local_rank_from == "OMPI_COMM_WORLD_LOCAL_RANK"


def test_a_slurm_batch_script_not_started_by_srun_is_one_process():
    """sbatch --ntasks=8 runs the script once, with the allocation's SLURM_NTASKS and SLURM_PROCID=0
    but no job step: it is not rank 0 of 8."""
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "42"}
    assert (from_environment(batch).rank, from_environment(batch).world_size) == (None, None)
    assert from_environment({**batch, "SLURM_STEPID": "3"}).world_size == 8  # srun's older spelling


def test_a_rank_without_its_world_size_is_not_a_launch():
    launch = from_environment({"RANK": "1", "SLURM_LOCALID": "1"})
    assert (launch.rank, launch.world_size, launch.local_rank) == (None, None, 1)
    assert from_environment({}) == from_environment({}).__class__(None, None, 0)


def test_a_bad_value_names_its_variable():
    with pytest.raises(ValueError, match="SLURM_LOCALID='x'"):
        from_environment({"SLURM_LOCALID": "x"})

"""Where a process sits, read from its launcher's variables: pure functions of an environment.

torchrun (and Lightning's own launcher) set ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; other
launchers set only their own: Open MPI's ``mpirun`` ``OMPI_COMM_WORLD_*``, MPICH's and Intel
MPI's (Hydra) ``PMI_RANK``/``PMI_SIZE`` with ``MPI_LOCALRANKID`` (or ``PMI_LOCAL_RANK``), Slurm's
``srun`` ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``. A process started by one of those
without torchrun used to see a single process on local rank 0: every rank of a node on ``cuda:0``.

Which family wins, when several are set: torchrun's, then MPI's, then Slurm's. An ``mpirun``
inside a Slurm allocation starts its ranks through Slurm, so they inherit ``SLURM_*`` values that
describe mpirun's daemons (one per node, local id 0), not the ranks; MPI's variables are set for
each rank. Rank and world size come as a pair from one family; the local rank from
``LOCAL_RANK``, else the same family, else the first local variable set. Slurm's pair counts only
inside a job step (``SLURM_STEP_ID``, which srun sets): the batch script's own process sees
``SLURM_NTASKS`` of the whole allocation and ``SLURM_PROCID=0``, and would read a part of the data
as rank 0 of ranks that do not exist.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Launch", "RANK_VARIABLES", "LOCAL_RANK_VARIABLES", "from_environment"]

# (launcher, rank variable, world size variable, its local rank variables), in the order they count
RANK_VARIABLES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("torchrun", "RANK", "WORLD_SIZE", ("LOCAL_RANK",)),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_RANK",)),
    ("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK")),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", ("SLURM_LOCALID",)),
)
LOCAL_RANK_VARIABLES: tuple[str, ...] = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                        "SLURM_LOCALID")


@dataclass(frozen=True)
class Launch:
    """What the launcher said: ``rank``/``world_size`` (``None``: no family sets both), the
    ``local_rank`` (0 when nothing says), and the variables each was read from."""

    rank: int | None
    world_size: int | None
    local_rank: int
    rank_from: str = ""
    local_rank_from: str = ""


def from_environment(env: Mapping[str, str]) -> Launch:
    """Rank, world size and local rank from ``env`` (``os.environ``); see the module's rules.
    A value that is not a non-negative integer raises ``ValueError`` naming the variable."""
    rank = world_size = None
    rank_from, locals_first = "", LOCAL_RANK_VARIABLES
    for launcher, rank_var, size_var, local_vars in RANK_VARIABLES:
        if launcher == "Slurm" and not (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")):
            continue  # not started by srun: the batch script itself
        if env.get(rank_var, "") != "" and env.get(size_var, "") != "":
            rank, world_size = _integer(env, rank_var), _integer(env, size_var)
            rank_from = f"{rank_var}/{size_var}"
            locals_first = ("LOCAL_RANK", *local_vars, *LOCAL_RANK_VARIABLES)
            break
    for var in locals_first:
        if env.get(var, "") != "":
            return Launch(rank, world_size, _integer(env, var), rank_from, var)
    return Launch(rank, world_size, 0, rank_from, "")


def _integer(env: Mapping[str, str], var: str) -> int:
    text = env[var].strip()
    if not text.isdigit():
        raise ValueError(f"{var}={env[var]!r} is not a non-negative integer")
    return int(text)

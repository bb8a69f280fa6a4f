"""The torchrun environment (WORLD_SIZE, RANK, LOCAL_RANK, ...), read once and validated.

Why validate: tzrec reads these with a bare ``int(os.environ.get(...))``. A typo there is a
``ValueError`` with no variable name, and a wrong but parseable value (``LOCAL_RANK=-1``)
silently starts no server, or two. Here every bad value names the variable and what to set.
Blank values count as unset, as elsewhere in healthkit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from healthkit import InvalidArgumentError
from healthkit._shared import check_int

__all__ = ["DistEnv", "check_index"]

_WHO_SETS = "torchrun sets it for every worker; unset it or set it to a valid value"


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    # ASCII digits only: int() would also take "1_0", "+1" and digits of other scripts.
    value = int(text) if text.isascii() and text.isdigit() else minimum - 1
    if value < minimum:
        raise InvalidArgumentError(
            f"{name}={raw!r} is not an integer >= {minimum} ({_WHO_SETS})", name
        )
    return value


def check_index(value: object, what: str) -> int:
    """An explicit index argument: a non-negative int (bools refused: ``True`` is not 1 here)."""
    return check_int(value, what, minimum=0)


@attrs.frozen
class DistEnv:
    """Where this process sits in a torchrun job; the defaults describe a single process.

    ``group_rank`` is the node index (torchrun's ``GROUP_RANK``), which is also the
    ``task_index`` of that node's sampler server and its position in the server list.
    """

    world_size: int = attrs.field(default=1)
    rank: int = attrs.field(default=0)
    local_world_size: int = attrs.field(default=1)
    local_rank: int = attrs.field(default=0)
    group_rank: int = attrs.field(default=0)

    def __attrs_post_init__(self) -> None:
        check_int(self.world_size, "world_size", minimum=1)
        check_int(self.rank, "rank", minimum=0, maximum=self.world_size - 1)
        check_int(self.local_world_size, "local_world_size", minimum=1, maximum=self.world_size)
        check_int(self.local_rank, "local_rank", minimum=0, maximum=self.local_world_size - 1)
        check_int(self.group_rank, "group_rank", minimum=0)

    @property
    def group_size(self) -> int:
        """Number of nodes, as tzrec computes it (``WORLD_SIZE // LOCAL_WORLD_SIZE``)."""
        return self.world_size // self.local_world_size

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> DistEnv:
        """Read and cross-check the torchrun variables.

        Raises:
            InvalidArgumentError: a variable is not a valid integer, or the values contradict
                each other (e.g. ``RANK >= WORLD_SIZE``); the message names the variable.
        """
        env = os.environ if env is None else env
        world = _env_int(env, "WORLD_SIZE", 1, 1)
        rank = _env_int(env, "RANK", 0, 0)
        local_world = _env_int(env, "LOCAL_WORLD_SIZE", 1, 1)
        local_rank = _env_int(env, "LOCAL_RANK", 0, 0)
        group_rank = _env_int(env, "GROUP_RANK", 0, 0)
        problems: list[tuple[str, str]] = []
        if rank >= world:
            problems.append(("RANK", f"RANK={rank} must be < WORLD_SIZE={world}"))
        if local_rank >= local_world:
            problems.append(
                ("LOCAL_RANK", f"LOCAL_RANK={local_rank} must be < LOCAL_WORLD_SIZE={local_world}")
            )
        if local_world > world:
            text = f"LOCAL_WORLD_SIZE={local_world} must be <= WORLD_SIZE={world}"
            problems.append(("LOCAL_WORLD_SIZE", text))
        if problems:
            raise InvalidArgumentError(
                "inconsistent torchrun environment: "
                + "; ".join(text for _, text in problems)
                + f" ({_WHO_SETS})",
                problems[0][0],
            )
        return cls(world, rank, local_world, local_rank, group_rank)

    @staticmethod
    def local_rank_from_environ(env: Mapping[str, str] | None = None) -> int:
        """Only ``LOCAL_RANK`` (default 0), for callers that need nothing else."""
        return _env_int(os.environ if env is None else env, "LOCAL_RANK", 0, 0)


import healthkit_graphlearn as _package  # noqa: E402

_package._publish(__name__)

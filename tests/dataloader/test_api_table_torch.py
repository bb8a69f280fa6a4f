"""healthkit_torch's row of the API table (see tests/api_table.py): a bad value of every
argument of every public function, refused at the call with a typed HealthkitError naming
it; public module names; the exported error pickles with its attributes."""

from __future__ import annotations

import pickle
from typing import Any

import healthkit_torch as ht
import pytest
from api_table import Case, cases, check, missing_rows, public_callables

import healthkit as hk

T = hk.InvalidArgumentTypeError

TORCH: dict[str, dict[str, Any]] = {
    "healthkit_torch.watch": {
        "loader": [Case(lambda _: ht.watch([1, 2]), T, label="list"),  # type: ignore[type-var]
                   Case(lambda _: ht.watch(None), T, label="none")],  # type: ignore[type-var]
    },
    "healthkit_torch.watching_all": {
        "enabled": Case(lambda _: ht.watching_all("yes"), T),  # type: ignore[arg-type]
    },
}
TORCH_EXEMPT = {
    "healthkit_torch.DataLoader": "torch's own DataLoader arguments, passed to it unchanged",
    "healthkit_torch.DataLoaderWorkerError": "an error (its pickling is tested below)",
}


def test_every_public_callable_has_a_row() -> None:
    missing = missing_rows([ht], TORCH, TORCH_EXEMPT, {})
    assert not missing, f"public API without a bad-input row: {missing}"


@pytest.mark.parametrize(("arg", "case"), cases(TORCH))
def test_bad_input_is_refused_at_the_call(arg: str, case: Case) -> None:
    check(arg, case, None)


def test_every_exported_object_reports_its_public_module() -> None:
    wrong = {k: o.__module__ for k, o in public_callables([ht])
             if o.__module__ != "healthkit_torch"}
    assert not wrong, wrong


def test_the_exported_error_pickles_with_its_attributes() -> None:
    diagnoser = hk.ExitDiagnoser()
    try:
        d = diagnoser.diagnose(-9, name="DataLoader worker 1", pid=4242, evidence=False)
    finally:
        diagnoser.close()
    err = ht.DataLoaderWorkerError(str(d), d, 1)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ht.DataLoaderWorkerError and isinstance(back, RuntimeError)
    assert (str(back), back.worker_id, back.pid, back.diagnosis) == (str(err), 1, 4242, d)


def test_docs_index_lists_exactly_the_public_names() -> None:
    import re
    from pathlib import Path

    index = (Path(__file__).resolve().parents[2] / "docs" / "index.md").read_text()
    section = index[index.index("## Public names") : index.index("## Pages")]
    bullet = re.search(r"- `healthkit_torch`[^:]*:(.*?)(?=\n- `|\Z)", section, re.S)
    assert bullet is not None
    assert set(re.findall(r"`(\w+)`", bullet.group(1))) == set(ht.__all__)
    assert list(ht.__all__) == sorted(ht.__all__)

"""`tlt bench update`: bad arguments are refused by name before anything loads."""

from __future__ import annotations

import pytest

from tlt.bench.update_pass import run_update_bench
from tlt.cli import main


@pytest.mark.parametrize(("kwargs", "field"), [({"pairs": 0}, "--pairs"), ({"threads": 0}, "--threads")])
def test_bad_arguments_name_the_flag(kwargs, field):
    with pytest.raises(ValueError, match=field):
        run_update_bench(**kwargs)


def test_the_cli_reports_a_bad_argument_and_exits_2(capsys):
    assert main(["bench", "update", "--pairs", "0"]) == 2
    assert "--pairs must be >= 1" in capsys.readouterr().out

"""axonn.cli.run_main: a refusal every rank reaches alike is printed once (by rank 0), a full disk is one line."""
import errno

import pytest

from axonn.cli import SameOnEveryRank, disk_full, launched_rank, run_main


def _refuse():
    raise SameOnEveryRank("error: --grid 1,3,1,1: row=3 does not divide heads=4")


@pytest.mark.parametrize("var", ["RANK", "SLURM_PROCID", "PMI_RANK"])
def test_a_refusal_the_same_on_every_rank_is_printed_by_rank_0_only(monkeypatch, var):
    for v in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(SystemExit) as e:  # alone: rank 0, the message is the exit code (printed, status 1)
        run_main(_refuse, "")
    assert str(e.value.code).startswith("error: --grid")
    monkeypatch.setenv(var, "3")
    assert launched_rank() == 3
    with pytest.raises(SystemExit) as e:  # another rank: status 1, nothing printed
        run_main(_refuse, "")
    assert e.value.code == 1


def test_a_full_disk_deep_in_a_chain_is_one_line_with_the_resume_hint():
    def save():
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:  # what torch.save raises: the stream's position, the OSError in its chain
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 12608 vs 12502") from inner

    with pytest.raises(SystemExit) as e:
        run_main(save, "the same command with --resume continues")
    assert e.value.code == ("error: no space left on the device: free space there or write elsewhere (the same "
                            "command with --resume continues)")
    assert disk_full(RuntimeError("unexpected pos")) is None
    with pytest.raises(RuntimeError, match="other"):  # any other error keeps its traceback
        run_main(lambda: (_ for _ in ()).throw(RuntimeError("other")), "")

"""The GPU lock's creation is said in the campaign's words on the terminal (a plain line, INFO
in the flow's log), never as a Prefect-formatted WARNING; a slot held by others stays one."""

from __future__ import annotations

import logging

from gpucampaign_prefect.orchestration.gpu_lock import say_lock_note


def test_a_created_lock_is_a_plain_line_and_a_held_slot_a_warning(capsys, caplog):
    log = logging.getLogger("test_lock_note")
    created = (
        "GPU lock: created 'gpu' on this Prefect server with 1 slot(s), one per GPU of the "
        "committed lots; every campaign's runs take them in turn"
    )
    with caplog.at_level(logging.INFO, logger="test_lock_note"):
        say_lock_note(created, logger=log)
        say_lock_note("GPU lock 'gpu': 1/1 slot(s) held by no running flow run of ours", logger=log)
        say_lock_note("", logger=log)
    assert capsys.readouterr().err == created + "\n"
    assert [(r.levelno, r.getMessage()[:17]) for r in caplog.records] == [
        (logging.INFO, "GPU lock: created"),
        (logging.WARNING, "GPU lock 'gpu': 1"),
    ]

"""The tests' shared helpers, imported as ``from tests.helpers import ...``.

``closing``: a small, real, closed output folder; ``engine``: the digits corpus (the
``digits_file`` fixture), tiny specs and short runs; ``specs``: calendar-only specs; ``stack``:
the real stack of the end-to-end and fault suites. ``stack_fixtures`` holds that stack's
session fixtures, which tests/conftest.py imports; ``killrun.py`` is the child process of the
kill tests, run by its path.
"""

from tests.helpers.closing import (
    SPEC_TEMPLATE,
    build_closed_folder,
    close_and_seal,
    reseal,
    start_folder,
    train_every_run,
    write_corpus,
)
from tests.helpers.engine import TINY, corpus_of, digits_file, make_spec, run, run_dir, train_losses
from tests.helpers.specs import TRAIN_CONTROL, one_lot_spec
from tests.helpers.stack import (
    CHROMIUM,
    EXAMPLE,
    ROOT,
    RUN_TIMEOUT_S,
    S3_BUCKET,
    STACK,
    TERMINAL,
    api,
    bucket_keys,
    chromium,
    create_pool,
    free_port,
    keep_screenshot,
    page_text,
    pool_deployment,
    run_deployment,
    s3_client,
    stack_s3_env,
    start_deployment,
    start_worker,
    stop_worker,
    tiny_spec,
    wait_flow_run,
    worker_log,
)

__all__ = [
    "CHROMIUM",
    "EXAMPLE",
    "ROOT",
    "RUN_TIMEOUT_S",
    "S3_BUCKET",
    "SPEC_TEMPLATE",
    "STACK",
    "TERMINAL",
    "TINY",
    "TRAIN_CONTROL",
    "api",
    "bucket_keys",
    "build_closed_folder",
    "chromium",
    "close_and_seal",
    "corpus_of",
    "create_pool",
    "digits_file",
    "free_port",
    "keep_screenshot",
    "make_spec",
    "one_lot_spec",
    "page_text",
    "pool_deployment",
    "reseal",
    "run",
    "run_deployment",
    "start_deployment",
    "run_dir",
    "s3_client",
    "stack_s3_env",
    "start_folder",
    "train_every_run",
    "start_worker",
    "stop_worker",
    "tiny_spec",
    "train_losses",
    "wait_flow_run",
    "worker_log",
    "write_corpus",
]

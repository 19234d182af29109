"""The Prefect layer of gpucampaign, installed under the project's own name.

``flows`` (the ``@flow``s), ``tasks`` (one ``@task`` module per phase) and ``orchestration``
(what both share: the locks, the embedded server, notifications, the UI's views) live here,
with ``deployments/prefect.yaml``: one path each, in the checkout as in the wheel, so that an
installed ``campaign run`` works from any folder and no bare ``flows`` or ``tasks`` module
lands in site-packages, where it would shadow a user's own. Ranks, lowest first:
orchestration < tasks < flows (``tests/test_layers.py``).
"""

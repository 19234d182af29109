"""The Prefect layer of gpucampaign, installed under the project's own name.

The repository keeps ``flows/``, ``tasks/`` and ``orchestration/`` at its top level; in the
checkout this package links to them, and the built distribution carries them here, so that
an installed ``campaign run`` works from any folder and no bare ``flows`` or ``tasks`` module
lands in site-packages, where it would shadow a user's own.
"""

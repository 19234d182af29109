"""``python -m gpucampaign.cli``: the ``campaign`` command."""

from gpucampaign.cli import main

main()

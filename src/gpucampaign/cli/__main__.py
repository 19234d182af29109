"""``python -m gpucampaign.cli``: the ``campaign`` command."""

from gpucampaign.cli.commands import main

main()

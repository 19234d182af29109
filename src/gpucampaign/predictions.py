"""``python -m gpucampaign.predictions reload-check|predict OUT ...``: the command RELOAD.md gives.

A face kept at the top of the package so the command printed in every output folder's
RELOAD.md, before and after the library was split into subpackages, keeps working. The code
is ``gpucampaign.close.predictions``.
"""

from gpucampaign.close.predictions import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())

"""Verification of a closed output folder: one function per check."""

from gpucampaign.verify.checks import verify_output

__all__ = ["verify_output"]

"""gpucampaign: a training campaign on a rented GPU lot that ends in a decision."""

__version__ = "0.1.0"

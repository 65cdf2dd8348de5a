"""The GitHub workflows rehearsed for real on this machine with act (host mode), GitHub's
hosted services replaced by the composite actions under .github/act-standins/."""

"""How an image runs and is waited for, on one node or several: the run settings
(runspec), the per-node files (nodefiles), compose (one detection, one clean-up), the
boot wait (boot, logwatch), one container (container) or a multi-node cell's nodes
(nodes), and `build.py launch`. Smoke, the release gates and the bench start their
servers here, so none of them imports another."""

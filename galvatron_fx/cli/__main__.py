"""``python -m galvatron_fx.cli`` (what ``torchrun -m galvatron_fx.cli ...`` runs)."""

from galvatron_fx.cli import run_as_main

run_as_main()

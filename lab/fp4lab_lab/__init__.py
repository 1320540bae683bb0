"""fp4lab's lab: what runs only on this repository's own data and writes into its docs/, kept out of the
installed package (pyproject.toml ships python/fp4lab alone). It may import fp4lab; fp4lab never imports it
(tests/python/project/test_layering.py).

  simval  the simulator's validation against the H200 (docs/validation.md; scripts/sim_validation.py runs it)

Put lab/ on PYTHONPATH to import it (the scripts that use it do so themselves; ctest sets it).
"""

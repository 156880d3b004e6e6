# The sdist of python-nomad 2.1.0 ships its tests/ without this package's glue; scripts/install-deps
# copies these three files beside them.

"""The ground floor: the ``GpupipeError`` tree (:mod:`.errors`), the frozen value types that cross
stages and processes (:mod:`.types`), and what is read off the machine and the environment
(:mod:`.machine`). Imports nothing else of gpupipe."""

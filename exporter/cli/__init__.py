"""The command line: the flag table (`flagtable`), its value types (`values`), the parser
that turns flags and `KDE_*` variables into the frozen `Config` (`flags`, `config`), and the
commands (`main`). Everything outside reads the `Config`; only here knows about flags."""

"""Every setting, declared once: its flag, variable, typed default, help and group
(`table`), the value types that parse them (`values`) and the frozen `Config` built from the
rows (`config`). A leaf: it imports nothing else of the product, so anything may read it;
parsing flags and variables into a `Config` is `exporter.cli`'s."""

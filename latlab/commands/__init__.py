"""The application layer: one module per command, each owning its options (declared once,
see `options`), the run, what it prints and its exit code (`common`). `latlab.cli` only
declares them. Commands may import every layer below; nothing below imports them."""

"""The console's pages, one module per page group. Thin: every change goes through a
service, every read through a selector (docs/dev/style.md rules 1, 2 and 7)."""

"""Any process: pickling what the wire cannot lay out flat (``pickler``), what pickle refuses by
name carried by value (``by_value``), and what a spawned worker's run of the script has
(``main_script``). See docs/design/pickling.md."""

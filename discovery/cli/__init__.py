"""`toolreg`: the parser and one module per command group; the one place that assembles the subsystems."""

from discovery.cli.main import delete_config_item, get_config_item, list_config_items, main, put_config_item

__all__ = ["delete_config_item", "get_config_item", "list_config_items", "main", "put_config_item"]

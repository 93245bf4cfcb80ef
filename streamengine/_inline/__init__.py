"""Inline tool blocks ``<tool name="...">{...}</tool>``: the scanner, one block's validity, the prompt."""

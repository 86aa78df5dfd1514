"""The admins' view: drained nodes with their evidence, the HTML report, resuming."""

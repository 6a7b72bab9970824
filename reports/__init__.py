"""Reports: HTML, Markdown, JSON and JUnit from a run directory and its verdict; rollback decisions."""

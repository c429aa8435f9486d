"""One module per command; each returns an output.Report and never prints or exits."""

"""The rules of shellbox: limits, tenancy, container lifecycle, files, calls. No HTTP here."""

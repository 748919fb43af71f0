"""The Markdown/HTML docs folder connector: one ``doc_page`` row per file, one ``doc_section`` row per heading."""

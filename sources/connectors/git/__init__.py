"""The git repository connector: files, language-aware code chunks and commits of one repository.

``config.GitConfig`` is the configuration, ``chunker`` splits a file along its language's
boundaries (tree-sitter for Python, JavaScript, TypeScript and Go; line windows otherwise) and
``connector.GitConnector`` turns a repository at one revision into ``code_file``,
``code_chunk`` and ``commit`` rows.
"""

"""Publishing the book: recording chapters on the GPU and building the site from the
recordings. No chapter imports this package.

- book: the book's TOC and chapters, read with one-line BookErrors; where recordings go
- hashes: what a recording is checked against: its chapter's code cells, the package
  modules they import (as Python parses them), its artifacts
- validation: reading a recording's notebook and checking that it is whole and its own
- recordings: whether each chapter's recording is still valid (`status`)
- preflight: what the record command checks before it runs (packages, chapters, room)
- record: the command that records chapters (`python -m gpuinfer.publish.record`)
- store: writing a recording's notebook and artifacts together, whatever fails or kills it
- compare: two recordings of a chapter, glued value by glued value
- sphinx_recordings: the Sphinx extension that builds the pages from the recordings, with
  their provenance, and the table of the chapters' run times
- sphinx_results: the results-at-a-glance table, read from the recordings' glued values
- sphinx_site: the datasheet table, the download menu, figure alt text, page-head fixes
- sphinx_bib: author-year labels for the references
"""

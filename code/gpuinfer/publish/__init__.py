"""Publishing the book: recording chapters on the GPU and building the site from the
recordings. No chapter imports this package.

- book: the book's TOC and chapters, read with one-line BookErrors; where recordings go
- cells, names: a chapter's measurement and presentation cells, what passes between
  them, and the rules a presentation cell keeps; the names a cell reads and binds
- reach, units: the package definitions a chapter's measurement cells reach (staleness by
  definitions), and a module split into its units
- parsed, sources: Python source as a parse tree and as position-free text; the
  package's source files, where the analysis reads them
- hashes: what a recording is checked against: its measurement cells as parsed, the
  definitions they reach, its recorded outputs, its artifacts
- kept: the values a recording keeps for its presentation cells (data.json)
- present: running a chapter's presentation cells from its recording, as the build does
- validation: reading a recording's notebook and checking that it is whole
- recordings: whether each chapter's recording is still valid (`status`; `python -m
  gpuinfer.publish.recordings` prints every chapter's state)
- preflight: what the record command checks before it runs (packages, chapters, room)
- record, measuring: the command that records chapters (`python -m
  gpuinfer.publish.record`); running a chapter's measurement cells in a kernel
- recorder: the recorder's set-up (the kernel's start, gpu_record.sh, start-up hooks,
  requirement pins), hashed into every recording: a change to it stales every chapter
- store: writing a recording's notebook and artifacts together, whatever fails or kills it
- glued: every value a chapter's page glues, as JSON (`python -m gpuinfer.publish.glued`)
- compare: two recordings of a chapter, glued value by glued value
- gpumem: the peak GPU memory a chapter used while it was recorded
- sphinx_recordings, sphinx_provenance, titles: the Sphinx extensions that build the
  pages from the recordings and put each recording's provenance under its chapter's title
- sphinx_results: the results-at-a-glance table, read from the pages' glued values
- sphinx_site, sphinx_datasheet, sphinx_repository, sphinx_downloads, sphinx_figures,
  tables: the site's stylesheet and page-head fixes; the datasheet table; the repository's
  address, button and commands; the download menu; figure alt text; docutils tables
- sphinx_bib: author-year labels for the references
- build: the build command (`python -m gpuinfer.publish.build`): the book checked as the
  record command checks it, then `jupyter-book build`, its seconds, and with --pdf the PDF
- pdf: the whole book as one PDF, printed from the built site by Chromium
"""

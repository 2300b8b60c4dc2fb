"""Tools that run around a benchmark to make an MLPerf Storage submission:
dlio-ckpt-submit's invocations (submit), the folder tree and metadata MLCommons'
checker reads (tree), and the page-cache drop between phases (dropcache)."""

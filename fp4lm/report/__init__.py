"""The comparison report, rendered from records (fp4lm.compare writes them): results.json's aggregate and its
statistics (results.py, stats.py), the plots (plots.py) and report.html / report.md (html.py, markdown.py,
glossary.py). Reads nothing but records; runs nothing.
"""

"""Side-by-side comparison of precision recipes: run them, collect records, plot, write HTML/Markdown.

`fp4lm compare` (see compare.py) trains each recipe in its own subprocess with identical settings, turns
each finished run into a record file (records.py), aggregates the records into results.json
(results.py), draws the plots (plots.py) and writes report.html / report.md (html.py, markdown.py).
"""

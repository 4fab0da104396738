#!/usr/bin/python3
"""Checks that every figure README.md quotes from bench/results/ is in the file it cites.

A figure is a ratio (0.86x), a percentage (90.61%) or a time (71.4 ms); it belongs to the next
citation of a results file (bench/results/NAME) in the same paragraph or table row, and one with
no citation after it is an error. The number must appear in that file as written, and a date
written beside the citation (2026-12-02) must appear in it too. Prints each figure that is not found and exits 1; 0 when all are.
Usage: tools/check_readme_figures.py [README.md] [--root DIR]"""

import argparse
import os
import re
import sys

FIGURE = re.compile(r"(?<![\w.^-])(\d+\.\d+)(?:x\b|%| ms\b)|(?<![\w.^-])(\d+)%")
CITATION = re.compile(r"bench/results/([\w.-]+(?:/[\w.-]+)*\.md)")
DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")


def blocks(text):
    """Paragraphs and table rows, outside code blocks."""
    inside_code = False
    paragraph = []
    for line in text.splitlines():
        if line.startswith("```"):
            inside_code = not inside_code
            continue
        if inside_code:
            continue
        if line.startswith("|"):
            if paragraph:
                yield " ".join(paragraph)
                paragraph = []
            yield line
        elif line.strip():
            paragraph.append(line)
        elif paragraph:
            yield " ".join(paragraph)
            paragraph = []
    if paragraph:
        yield " ".join(paragraph)


def problems(readme_text, root):
    found = []
    cache = {}

    def results(name):
        if name not in cache:
            path = os.path.join(root, "bench", "results", name)
            cache[name] = open(path).read() if os.path.isfile(path) else None
        return cache[name]

    for block in blocks(readme_text):
        position = 0
        for citation in CITATION.finditer(block):
            covered = block[position:citation.start()]
            # The citation's own brackets: up to the closing one, dates included.
            close = block.find(")", citation.end())
            note = block[citation.end():close if close >= 0 else len(block)]
            position = close + 1 if close >= 0 else citation.end()
            text = results(citation.group(1))
            if text is None:
                if FIGURE.search(covered):
                    found.append(f"quotes figures from bench/results/{citation.group(1)}, which "
                                 "does not exist")
                continue
            for figure in FIGURE.finditer(covered):
                number = figure.group(1) or figure.group(2)
                if not re.search(rf"(?<![\d.]){re.escape(number)}(?!\d)", text):
                    context = covered[max(0, figure.start() - 60):figure.end()]
                    found.append(f"{figure.group(0)} (before bench/results/{citation.group(1)}) "
                                 f"is not in that file: ...{context}")
            for date in DATE.findall(note):
                if date not in text:
                    found.append(f"the date {date} beside bench/results/{citation.group(1)} is "
                                 "not in that file")
        for figure in FIGURE.finditer(block[position:]):
            context = block[position:][max(0, figure.start() - 60):figure.end()]
            found.append(f"{figure.group(0)} cites no results file after it: ...{context}")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readme", nargs="?", default="README.md")
    parser.add_argument("--root", help="the repository root (default: the README's folder)")
    args = parser.parse_args()
    root = args.root or os.path.dirname(os.path.abspath(args.readme))
    with open(args.readme) as handle:
        found = problems(handle.read(), root)
    for problem in found:
        print(f"check_readme_figures: {problem}")
    print(f"check_readme_figures: {len(found)} figure(s) not found in the results they cite")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Checks that every relative link in README.md and docs/*.md resolves: the file (or folder) it
# names exists, and a #anchor names a heading of the target Markdown file (GitHub's rule: lower
# case, punctuation dropped, spaces to hyphens; a repeated heading gets -1, -2, ...). Links in
# code blocks and code spans are not links. Web links (scheme:...) are not checked.
#   tests/check_links.sh [FILE.md...]      (default: README.md docs/*.md)
# Prints each broken link as FILE:LINE: TARGET (why) and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Prints "LINE<TAB>TARGET" for every link [text](target) of a Markdown file.
links_of() {
  awk '
    /^[ \t]*```/ { fence = !fence; next }
    fence { next }
    {
      line = $0
      gsub(/`[^`]*`/, "", line)                     # code spans
      while (match(line, /\]\([^) \t]+( "[^"]*")?\)/)) {
        target = substr(line, RSTART + 2, RLENGTH - 3)
        sub(/ ".*$/, "", target)
        print NR "\t" target
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1"
}

# Prints the anchors of a Markdown file's headings, one a line.
anchors_of() {
  awk '
    /^[ \t]*```/ { fence = !fence; next }
    fence { next }
    /^#+ / {
      h = $0
      sub(/^#+ +/, "", h); sub(/ +#* *$/, "", h)
      h = tolower(h)
      gsub(/[^a-z0-9 _-]/, "", h)
      gsub(/ /, "-", h)
      if (h in seen) { seen[h]++; print h "-" seen[h] } else { seen[h] = 0; print h }
    }' "$1"
}

if [[ $# -eq 0 ]]; then
  set -- README.md docs/*.md
fi
broken=0
checked=0
for file in "$@"; do
  dir=$(dirname "$file")
  while IFS=$'\t' read -r line target; do
    [[ $target =~ ^[a-zA-Z][a-zA-Z0-9+.-]*: ]] && continue   # http:, https:, mailto:
    checked=$((checked + 1))
    path=${target%%#*}
    anchor=""
    [[ $target == *"#"* ]] && anchor=${target#*#}
    if [[ -z $path ]]; then
      resolved=$file
    else
      resolved=$dir/$path
    fi
    if [[ ! -e $resolved ]]; then
      echo "$file:$line: $target (no such file: $resolved)"
      broken=$((broken + 1))
      continue
    fi
    if [[ -n $anchor && $resolved == *.md ]]; then
      if ! anchors_of "$resolved" | grep -qxF -- "$anchor"; then
        echo "$file:$line: $target (no heading with anchor #$anchor in $resolved)"
        broken=$((broken + 1))
      fi
    fi
  done < <(links_of "$file")
done
if [[ $broken -gt 0 ]]; then
  echo "$broken broken link(s) of $checked relative link(s)"
  exit 1
fi
echo "all $checked relative links resolve"

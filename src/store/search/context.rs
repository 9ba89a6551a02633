//! The line of context of a search hit: the words of its text around the first place it holds
//! one of the words asked for. Made here from a window of the text, on SQLite and PostgreSQL
//! alike: the text is read up to that place (keeping only the last few words passed) and a few
//! words past it, never whole. FTS5's `snippet()` and PostgreSQL's `ts_headline` tokenize the
//! whole document for it, and bm25 ranks the longest documents first for a word in nearly
//! every one (13 KB a hit, 780 KB for an answer of 50: docs/benchmarks-search.md).

use std::collections::{HashSet, VecDeque};

/// Words in a line (what `snippet()` was asked for).
const WORDS: usize = 16;
/// Words before the one found, at least, where the text has them (the rest after it).
const BEFORE: usize = 7;

/// The words asked for as the index compares them: each split into its tokens (runs of
/// letters and digits), folded to lower case; a trailing `*` makes a word's last token a
/// prefix (SQLite's queries only). Made once a search: a token of the text is then looked up
/// in a set, and compared with the few prefixes ([`super::MAX_WORDS`] at most), so a line
/// costs time linear in the text read (compared with every word asked for, a query of 19,500
/// words cost 19,500 comparisons a token: issue 47).
pub(super) struct Terms {
    exact: HashSet<String>,
    prefixes: Vec<String>,
}

impl Terms {
    pub(super) fn new(words: &[&str], prefixes: bool) -> Terms {
        let mut terms = Terms {
            exact: HashSet::new(),
            prefixes: Vec::new(),
        };
        for w in words {
            let (w, prefix) = match w.strip_suffix('*') {
                Some(stem) if prefixes && !stem.is_empty() => (stem, true),
                _ => (*w, false),
            };
            let parts: Vec<(usize, usize)> = tokens(w).collect();
            for (k, &(s, e)) in parts.iter().enumerate() {
                let folded: String = w[s..e].chars().flat_map(char::to_lowercase).collect();
                if prefix && k + 1 == parts.len() {
                    if !terms.prefixes.contains(&folded) {
                        terms.prefixes.push(folded);
                    }
                } else {
                    terms.exact.insert(folded);
                }
            }
        }
        terms
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    #[cfg(test)]
    fn matches(&self, token: &str) -> bool {
        self.matches_in(token, &mut String::new())
    }

    /// Whether `token` is one of the terms, folded into `buf` (one buffer for a whole text).
    fn matches_in(&self, token: &str, buf: &mut String) -> bool {
        buf.clear();
        buf.extend(token.chars().flat_map(char::to_lowercase));
        self.exact.contains(buf.as_str()) || self.prefixes.iter().any(|p| buf.starts_with(p))
    }
}

/// The line of context of `text` for `terms`: [`WORDS`] words around the first one found, with
/// `…` where the text goes on; None when none is found (as these terms fold words: the caller
/// asks the database's own function then).
pub(super) fn line(text: &str, terms: &Terms) -> Option<String> {
    let w = window(text, terms)?;
    let mut out = String::with_capacity(w.end - w.start + 6);
    if w.cut_before {
        out.push('…');
    }
    out.push_str(&text[w.start..w.end]);
    if w.cut_after {
        out.push('…');
    }
    Some(out)
}

/// The bytes of a line and whether the text goes on either side.
#[derive(Debug, PartialEq)]
struct Window {
    start: usize,
    end: usize,
    cut_before: bool,
    cut_after: bool,
}

/// Reads `text` a token at a time up to the first one `terms` match, keeping the last
/// `WORDS - 1` passed, then at most `WORDS` more: nothing past the line's end and the
/// next word.
fn window(text: &str, terms: &Terms) -> Option<Window> {
    if terms.is_empty() {
        return None;
    }
    let mut buf = String::new();
    let mut toks = tokens(text);
    let mut before: VecDeque<(usize, usize)> = VecDeque::with_capacity(WORDS);
    let mut dropped = false;
    let found = loop {
        let t = toks.next()?;
        if terms.matches_in(&text[t.0..t.1], &mut buf) {
            break t;
        }
        if before.len() == WORDS - 1 {
            before.pop_front();
            dropped = true;
        }
        before.push_back(t);
    };
    let after: Vec<(usize, usize)> = toks.by_ref().take(WORDS - 1).collect();
    let n_before = before.len().min(BEFORE.max(WORDS - 1 - after.len()));
    let n_after = after.len().min(WORDS - 1 - n_before);
    let first = before
        .get(before.len() - n_before)
        .copied()
        .unwrap_or(found);
    let last = n_after.checked_sub(1).map_or(found, |k| after[k]);
    Some(Window {
        start: first.0,
        end: last.1,
        cut_before: dropped || n_before < before.len(),
        cut_after: n_after < after.len() || toks.next().is_some(),
    })
}

/// The tokens of `text` as byte ranges: runs of letters and digits (as FTS5's `unicode61`
/// tokenizer has them, near enough: a word it folds otherwise is left to the database).
fn tokens(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut chars = text.char_indices().peekable();
    std::iter::from_fn(move || {
        let start = loop {
            let (i, c) = chars.next()?;
            if c.is_alphanumeric() {
                break i;
            }
        };
        let mut end = text.len();
        while let Some(&(i, c)) = chars.peek() {
            if !c.is_alphanumeric() {
                end = i;
                break;
            }
            chars.next();
        }
        Some((start, end))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(q: &str) -> Terms {
        Terms::new(&q.split_whitespace().collect::<Vec<_>>(), true)
    }

    fn words(n: usize, from: usize) -> String {
        (from..from + n).map(|i| format!("w{i} ")).collect()
    }

    #[test]
    fn a_short_text_is_its_own_line() {
        let text = "# Notes\n\nThe quick zebrafish swims.\nOther line.\n";
        assert_eq!(
            line(text, &terms("ZEBRAFISH quick")).unwrap(),
            "Notes\n\nThe quick zebrafish swims.\nOther line"
        );
        assert_eq!(line(text, &terms("okapi")), None);
    }

    /// A word far into a long document (past the 512 KiB most texts are cut to) is found, and its
    /// line is the words around it, cut on both sides.
    #[test]
    fn a_word_far_into_a_long_text_has_its_line() {
        let text = format!(
            "{}the hidden Okapi grazes here {}",
            words(80_000, 0),
            words(1000, 80_000)
        );
        assert!(text.len() > 512 * 1024);
        let l = line(&text, &terms("okapi")).unwrap();
        assert_eq!(
            l,
            "…w79995 w79996 w79997 w79998 w79999 the hidden Okapi grazes here w80000 w80001 \
             w80002 w80003 w80004 w80005…"
        );
        assert_eq!(l.split_whitespace().count(), WORDS);
    }

    /// The line is found within its window: of a long text whose first words hold the word, no
    /// more than the line and the word after it is read (the end of the window), and a later
    /// place holding more of the words asked for is not looked for.
    #[test]
    fn a_long_text_is_read_no_further_than_its_line() {
        let text = format!(
            "Okapi first. {}okapi and zebra together {}",
            words(100_000, 0),
            words(10, 0)
        );
        let w = window(&text, &terms("zebra okapi")).unwrap();
        let line_end = "Okapi first. ".len() + words(WORDS - 2, 0).len() - 1;
        assert_eq!(
            w,
            Window {
                start: 0,
                end: line_end,
                cut_before: false,
                cut_after: true
            }
        );
        assert!(text.len() > 100 * line_end);
    }

    #[test]
    fn the_line_leans_back_at_the_end_of_the_text() {
        let text = format!("{}okapi end.", words(40, 0));
        assert_eq!(
            line(&text, &terms("okapi")).unwrap(),
            "…w26 w27 w28 w29 w30 w31 w32 w33 w34 w35 w36 w37 w38 w39 okapi end"
        );
    }

    #[test]
    fn terms_fold_case_split_words_and_take_prefixes() {
        let t = terms("Grüße* e-mail");
        for hit in ["grüßen", "Grüße", "mail", "E"] {
            assert!(t.matches(hit), "{hit}");
        }
        for miss in ["GRÜSSE", "mails", "email"] {
            assert!(!t.matches(miss), "{miss}");
        }
        // FTS5 finds it (`remove_diacritics`), these terms do not: the database's line then.
        assert!(!t.matches("gruße"));
        // No prefixes on PostgreSQL (plainto_tsquery drops the `*`).
        assert!(!Terms::new(&["cehe*"], false).matches("cehexo"));
        assert!(Terms::new(&["cehe*"], false).matches("CEHE"));
        assert!(Terms::new(&["*"], true).is_empty());
    }
}

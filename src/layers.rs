//! The layer table of `src/lib.rs`, checked against the code: every `crate::X` path in a module's
//! code (not its tests) must name the module itself or one its row allows.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The table of `src/lib.rs`: each module and the modules it may use; and the known exceptions,
/// as (file, module it uses).
struct Table {
    uses: BTreeMap<String, BTreeSet<String>>,
    exceptions: BTreeSet<(String, String)>,
}

/// The names in backticks in `text`.
fn ticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn read_table(lib: &str) -> Table {
    let mut uses = BTreeMap::new();
    let mut exceptions = BTreeSet::new();
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if let Some(row) = doc.strip_prefix('|') {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            if let [module, _, allowed, ..] = cells[..] {
                if let [name] = &ticked(module)[..] {
                    uses.insert(name.clone(), ticked(allowed).into_iter().collect());
                }
            }
        } else if let Some(item) = doc.strip_prefix("- ") {
            if let ([file, module, ..], true) = (&ticked(item)[..], item.contains(" uses ")) {
                exceptions.insert((file.clone(), module.clone()));
            }
        }
    }
    Table { uses, exceptions }
}

/// A source file and the top-level module it belongs to.
struct Source {
    path: PathBuf,
    module: String,
}

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
}

/// The files a `#[cfg(test)] mod name;` in `file` brings in (`name.rs`, `name/mod.rs` and all
/// under `name/`), as path prefixes.
fn test_children(file: &Path, text: &str) -> Vec<PathBuf> {
    let dir = match file.file_name().and_then(|n| n.to_str()) {
        Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().unwrap().to_path_buf(),
        _ => file.with_extension(""),
    };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for pair in lines.windows(2) {
        if pair[0] != "#[cfg(test)]" {
            continue;
        }
        let decl = pair[1].trim_start_matches("pub ");
        if let Some(name) = decl.strip_prefix("mod ").and_then(|d| d.strip_suffix(';')) {
            out.push(dir.join(format!("{name}.rs")));
            out.push(dir.join(name));
        }
    }
    out
}

/// The identifier `s` starts with.
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The top-level modules named by `crate::` paths in `line` (its code, not a comment after it).
fn crate_paths(line: &str) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return Vec::new();
    }
    // A `//` outside a string starts a comment.
    let mut end = code.len();
    let mut quoted = false;
    let bytes = code.as_bytes();
    for i in 0..bytes.len() {
        match bytes[i] {
            b'"' if i == 0 || bytes[i - 1] != b'\\' => quoted = !quoted,
            b'/' if !quoted && bytes.get(i + 1) == Some(&b'/') => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let code = &code[..end];
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `vaultfs_crate::`, `$crate::`
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::X, b}`: the first name of each element at the top level of the braces.
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_alphanumeric() || c == '_') => {
                        out.push(ident(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// The library's files, each with its top-level module; test code left out. An inline
/// `#[cfg(test)] mod tests {` ends the file's code (rustfmt keeps it last).
fn sources(src: &Path) -> Vec<(Source, Vec<(usize, String)>)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut tests: Vec<PathBuf> = Vec::new();
    for f in &files {
        tests.extend(test_children(f, &fs::read_to_string(f).unwrap()));
    }
    let mut out = Vec::new();
    for path in files {
        let rel = path.strip_prefix(src).unwrap();
        let Some(first) = rel.components().next() else {
            continue;
        };
        let first = first.as_os_str().to_str().unwrap();
        if rel.components().count() == 1 && matches!(first, "lib.rs" | "main.rs") {
            continue;
        }
        if tests.iter().any(|t| path.starts_with(t)) {
            continue;
        }
        let module = first.trim_end_matches(".rs").to_string();
        let text = fs::read_to_string(&path).unwrap();
        let mut lines = Vec::new();
        let mut prev = "";
        for (i, line) in text.lines().enumerate() {
            // An inline test module ends what the file itself uses; a test module in a file
            // of its own (`mod tests;`, often at the top) ends nothing.
            if prev.trim() == "#[cfg(test)]" && line.trim_start().starts_with("mod ") {
                if line.trim_end().ends_with(';') {
                    prev = line;
                    continue;
                }
                break;
            }
            lines.push((i + 1, line.to_string()));
            prev = line;
        }
        out.push((Source { path, module }, lines));
    }
    out
}

#[test]
fn imports_follow_the_layer_table_of_lib_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let table = read_table(&fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut broken = Vec::new();
    let mut used_exceptions = BTreeSet::new();
    let mut modules = BTreeSet::new();
    for (source, lines) in sources(&src) {
        let file = source
            .path
            .strip_prefix(root)
            .unwrap()
            .display()
            .to_string();
        modules.insert(source.module.clone());
        let Some(allowed) = table.uses.get(&source.module) else {
            broken.push(format!(
                "{file}: module `{}` has no row in the layer table of src/lib.rs",
                source.module
            ));
            continue;
        };
        for (n, line) in lines {
            for used in crate_paths(&line) {
                if used == source.module || allowed.contains(&used) {
                    continue;
                }
                if table.exceptions.contains(&(file.clone(), used.clone())) {
                    used_exceptions.insert((file.clone(), used));
                    continue;
                }
                let may: Vec<&str> = allowed.iter().map(String::as_str).collect();
                broken.push(format!(
                    "{file}:{n}: `{}` uses `crate::{used}`, which the layer table of src/lib.rs \
                     does not allow (`{}` may use: {})",
                    source.module,
                    source.module,
                    if may.is_empty() {
                        "nothing".to_string()
                    } else {
                        may.join(", ")
                    }
                ));
            }
        }
    }
    for (file, used) in table.exceptions.difference(&used_exceptions) {
        broken.push(format!(
            "src/lib.rs: the exception \"{file} uses {used}\" is no longer needed: remove it"
        ));
    }
    for (module, allowed) in &table.uses {
        if !modules.contains(module) {
            broken.push(format!(
                "src/lib.rs: the layer table names `{module}`, not in src/"
            ));
        }
        for m in allowed {
            if !table.uses.contains_key(m) {
                broken.push(format!(
                    "src/lib.rs: `{module}` may use `{m}`, which has no row"
                ));
            }
        }
    }
    assert!(broken.is_empty(), "layers broken:\n{}", broken.join("\n"));
}

#[test]
fn crate_paths_are_read_from_code_only() {
    assert_eq!(crate_paths("use crate::store::Store;"), ["store"]);
    assert_eq!(
        crate_paths("    let x = crate::fs::f(); // crate::cli"),
        ["fs"]
    );
    assert_eq!(crate_paths("/// [`crate::store`]"), Vec::<String>::new());
    assert_eq!(
        crate_paths("use crate::{api::Error, store};"),
        ["api", "store"]
    );
    assert_eq!(crate_paths("f(\"http://x\", crate::api::g())"), ["api"]);
    assert_eq!(crate_paths("$crate::api::f()"), Vec::<String>::new());
}

// Circles (issue 48): within a module, its files' imports run one way too. A file may use its
// siblings and its own submodules; what it takes from the modules that hold it (`super::X` of
// a parent's own items) is not counted, as a room uses the house it is in. None is left, and
// the test fails on any: a circle is broken by moving what both sides share down to the one
// file that owns it (docs/design.md §1), never by listing it here.

/// The module path of a file: `src/fs/cache/download.rs` is `fs::cache::download`, and
/// `src/fs/staging/mod.rs` is `fs::staging`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    if segs.last().is_some_and(|s| s == "mod") {
        segs.pop();
    }
    segs
}

/// The paths named in `code` that start at `crate::`, `super::` or `self::`, with their use
/// groups expanded (`super::{a::X, b}` is `super::a::X` and `super::b`), as segments.
fn module_refs(code: &str) -> Vec<Vec<String>> {
    fn tree(s: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
        // Reads `seg::seg::...` then maybe `{tree, tree}`; returns the bytes read.
        let mut path = prefix;
        let mut i = 0;
        loop {
            let rest = &s[i..];
            if rest.starts_with('{') {
                let mut j = 1;
                loop {
                    let inner = s[i + j..].trim_start();
                    j = s.len() - i - inner.len();
                    if inner.starts_with('}') || inner.is_empty() {
                        j += 1;
                        break;
                    }
                    j += tree(inner, path.clone(), out);
                    let after = s[i + j..].trim_start();
                    j = s.len() - i - after.len();
                    if let Some(a) = after.strip_prefix(',') {
                        j = s.len() - i - a.len();
                    }
                }
                return i + j;
            }
            let name = ident(rest);
            if name.is_empty() {
                out.push(path);
                return i;
            }
            i += name.len();
            path.push(name);
            if s[i..].starts_with("::") {
                i += 2;
            } else {
                out.push(path);
                return i;
            }
        }
    }
    // Every path's start: a name followed by `::`, not itself after a name or `::` (`$crate::`
    // and `a::super::` are read from their start).
    // Positions inside a use group (`a::{...}`), whose paths are read with the group's.
    let mut grouped = vec![false; code.len() + 1];
    let mut depth = 0usize;
    for (i, c) in code.char_indices() {
        match c {
            '{' if code[..i].ends_with("::") => depth += 1,
            '}' if depth > 0 => depth -= 1,
            _ => {}
        }
        grouped[i] = depth > 0;
    }
    let mut out = Vec::new();
    for (at, _) in code.match_indices("::") {
        let head = &code[..at];
        let name_len = head
            .chars()
            .rev()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .map(char::len_utf8)
            .sum::<usize>();
        let start = at - name_len;
        if name_len == 0
            || grouped[start]
            || code[..start].ends_with([':', '$'])
            || code[start..].starts_with(|c: char| c.is_ascii_digit())
        {
            continue;
        }
        tree(&code[start..], Vec::new(), &mut out);
    }
    out
}

/// Where `path` (as written in the file of module `at`) leads: the longest prefix of it that is
/// a file's module.
fn resolve(at: &[String], path: &[String], files: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut full: Vec<String> = Vec::new();
    let mut segs = path.iter().peekable();
    match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
        }
        Some("self") => {
            segs.next();
            full = at.to_vec();
        }
        Some("super") => {
            full = at.to_vec();
            while segs.peek().is_some_and(|s| *s == "super") {
                segs.next();
                full.pop();
            }
        }
        // A bare path: a submodule of this one (`lifecycle::Life` in `staging`), else not a
        // module of ours (`std::fs`, `Arc::new`).
        _ => full = at.to_vec(),
    }
    let mut found = None;
    for s in segs {
        full.push(s.clone());
        if files.contains(&full) {
            found = Some(full.clone());
        }
    }
    found
}

/// The circles of `edges` (Tarjan's strongly connected components of more than one node).
fn circles(nodes: &[Vec<String>], edges: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in s.edges.get(&v).into_iter().flatten() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(i) if s.on[w] => s.low[v] = s.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let n = nodes.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_new_import_circle_between_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let sources = sources(&src);
    let modules: Vec<Vec<String>> = (sources.iter())
        .map(|(s, _)| module_path(&src, &s.path))
        .collect();
    let files: BTreeSet<Vec<String>> = modules.iter().cloned().collect();
    let index: BTreeMap<&Vec<String>, usize> =
        modules.iter().enumerate().map(|(i, m)| (m, i)).collect();
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (i, (_, lines)) in sources.iter().enumerate() {
        let at = &modules[i];
        for (_, line) in lines {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for path in module_refs(code) {
                let Some(target) = resolve(at, &path, &files) else {
                    continue;
                };
                // Itself, or a module holding it: not an edge.
                if target.len() <= at.len() && at[..target.len()] == target[..] {
                    continue;
                }
                edges.entry(i).or_default().insert(index[&target]);
            }
        }
    }
    let name = |i: usize| {
        (sources[i].0.path.strip_prefix(root).unwrap())
            .display()
            .to_string()
    };
    let mut broken = Vec::new();
    for circle in circles(&modules, &edges) {
        let names: Vec<String> = circle.iter().map(|&i| name(i)).collect();
        let ties: Vec<String> = circle
            .iter()
            .flat_map(|&a| {
                let c = &circle;
                let name = &name;
                (edges.get(&a).into_iter().flatten())
                    .filter(move |b| c.contains(b))
                    .map(move |&b| format!("{} -> {}", name(a), name(b)))
            })
            .collect();
        broken.push(format!(
            "an import circle: {}\n  {}",
            names.join(", "),
            ties.join("\n  ")
        ));
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn module_paths_are_read_with_their_groups() {
    let refs = module_refs("use super::{attrs::Kept, staging::{Staged, lifecycle}};");
    let want: Vec<Vec<String>> = [
        vec!["super", "attrs", "Kept"],
        vec!["super", "staging", "Staged"],
        vec!["super", "staging", "lifecycle"],
    ]
    .iter()
    .map(|v| v.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(refs, want);
    let files: BTreeSet<Vec<String>> = [
        vec!["fs".to_string()],
        vec!["fs".into(), "staging".into()],
        vec!["fs".into(), "staging".into(), "lifecycle".into()],
    ]
    .into();
    let at = vec!["fs".to_string(), "io".into()];
    assert_eq!(
        resolve(&at, &want[2], &files),
        Some(vec!["fs".into(), "staging".into(), "lifecycle".into()])
    );
    assert_eq!(
        resolve(&at, &["crate".into(), "fs".into(), "X".into()], &files),
        Some(vec!["fs".into()])
    );
}

/// Where the inode table's lock is taken (issue 48, item 2): by the table's own steps
/// (`src/fs/nodes*`, over `src/fs/table*`), and by the staged file's life
/// (`src/fs/staging/lifecycle*`), whose steps move a staged copy and its inode together. Every
/// other part asks one of their steps, so no other module holds the table across anything.
const TABLE_LOCK_OWNERS: &[&str] = &["fs/nodes", "fs/table", "fs/staging/lifecycle"];

#[test]
fn the_inode_tables_lock_is_taken_by_its_own_steps() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("fs"), &mut files);
    let mut takers = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        let text = fs::read_to_string(&f).unwrap();
        let takes = text.contains("nodes.lock()") || text.contains(".table.lock()");
        if takes && !TABLE_LOCK_OWNERS.iter().any(|o| rel.starts_with(o)) {
            takers.push(rel);
        }
    }
    assert!(
        takers.is_empty(),
        "the inode table's lock taken outside its own steps, in {takers:?}: make the step one \
         of the table's (`src/fs/nodes*`, `src/fs/table*`) or of the staged file's life"
    );
}

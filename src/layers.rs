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
            if prev.trim() == "#[cfg(test)]" && line.trim_start().starts_with("mod ") {
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

//! `vaultfs search [DIR] QUERY`: full-text search of the built-in store or of a server logged
//! in with `vaultfs login` (`GET /search`); the public service has none, and says so. DIR, a
//! folder in a running mount, searches under it in that mount's store.

use std::path::Path;

use clap::Args;

use super::DataDir;
use super::mounted::{Client, Mounted};
use super::terminal;
use crate::api::NodePath;
use crate::backend::Backend;
use crate::fs::status::StoreAt;

#[derive(Args)]
pub struct SearchArgs {
    /// [DIR] QUERY: the words to find (all of them; `word*` for a prefix), after a folder to
    /// search under: a folder in a running mount (`~/Vault/docs`: that mount's store is
    /// searched, and hits are shown as paths in the mount), or a vault path
    /// (`/Account/Vault/folder`)
    #[arg(value_name = "DIR_OR_WORD", required = true)]
    words: Vec<String>,
    #[command(flatten)]
    data: DataDir,
    /// Search a server instead of the built-in store (log in first with `vaultfs login`)
    #[arg(long, value_name = "URL", conflicts_with = "data_dir")]
    server: Option<String>,
    /// At most this many files
    #[arg(long, default_value_t = crate::api::search::DEFAULT_LIMIT, value_name = "N")]
    limit: u64,
    /// One JSON document (`hits`: `id`, `uri`, `context`; `more`) instead of lines
    #[arg(long)]
    json: bool,
}

/// The folder argument as a vault path.
fn vault_path(dir: &str) -> Result<NodePath, String> {
    if dir.starts_with("/nodes/pth") {
        return NodePath::parse_uri(dir).map_err(|e| e.to_string());
    }
    NodePath::from_segments(dir.split('/').filter(|s| !s.is_empty())).map_err(|e| e.to_string())
}

pub fn search(args: SearchArgs) -> Result<(), Box<dyn std::error::Error>> {
    // With more than one argument, the first is the folder when it is a path: a folder in a
    // mount, or a vault path.
    let mut words = args.words;
    let mut store = match &args.server {
        Some(url) => StoreAt::Server(url.clone()),
        None => StoreAt::DataDir(args.data.path()),
    };
    let mut dir = NodePath::root();
    let mut mounted = None;
    if words.len() > 1 {
        // Only a folder asks a mount (a word is never looked up as a path in one).
        let first = Path::new(&words[0]);
        let in_mount = match first.is_dir() {
            true => Mounted::of(first)?,
            false => None,
        };
        if let Some(m) = in_mount {
            words.remove(0);
            (dir, store) = (m.path.clone(), m.store.clone());
            mounted = Some(m);
        } else if words[0].starts_with('/') {
            dir = vault_path(&words.remove(0))?;
        }
    }
    let query = words.join(" ");
    let rt = tokio::runtime::Runtime::new()?;
    let found = match Client::open(&store)? {
        Client::Remote(backend) => rt.block_on(backend.search(&dir, &query, args.limit)),
        Client::Local(backend, store) => {
            let found = rt.block_on(backend.search(&dir, &query, args.limit));
            // Only a mount or `vaultfs serve` of the store makes the index (in idle time).
            if let Ok(n @ 1..) = store.search_backlog() {
                eprintln!(
                    "({n} file(s) not indexed yet: a mount or `vaultfs serve` of this store \
                     indexes them while it is idle)"
                );
            }
            found
        }
    }?;
    if args.json {
        // Names and words of documents: no escape sequence reaches the terminal.
        println!("{}", terminal::json(&serde_json::to_string_pretty(&found)?));
        return Ok(());
    }
    for hit in &found.hits {
        let path = match &mounted {
            Some(m) => m.local(&hit.uri),
            None => hit
                .uri
                .strip_prefix("/nodes/pth")
                .unwrap_or(&hit.uri)
                .to_string(),
        };
        // A file's name and words are anyone's: printed with their control and bidi
        // characters made visible, never acted on by the terminal.
        println!(
            "{}\n    {}",
            terminal::escaped(&path),
            terminal::escaped(&hit.context)
        );
    }
    if found.more && (found.hits.len() as u64) < args.limit.min(crate::store::MAX_SEARCH_LIMIT) {
        // Fewer than asked for, and more: the search stopped at its time bound.
        eprintln!(
            "(the search stopped at its time limit: more files may match; narrow it with more words or a folder)"
        );
    } else if found.more {
        eprintln!("(more files match: --limit {})", args.limit * 2);
    }
    Ok(())
}

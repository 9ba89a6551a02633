//! `vaultfs search [DIR] QUERY`: full-text search of the built-in store or of a server logged
//! in with `vaultfs login` (`GET /search`); the public service has none, and says so.

use std::sync::Arc;

use clap::Args;

use super::DataDir;
use crate::api::NodePath;
use crate::backend::Backend;
use crate::backend::local::LocalBackend;
use crate::backend::remote::RemoteBackend;
use crate::store::Store;

#[derive(Args)]
pub struct SearchArgs {
    /// [DIR] QUERY: the words to find (all of them; `word*` for a prefix), after a folder to
    /// search under when the first starts with `/` (a vault path, `/Account/Vault/folder`)
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
    // With more than one argument, the first is the folder when it is a path.
    let mut words = args.words;
    let dir = match words.first() {
        Some(d) if d.starts_with('/') && words.len() > 1 => vault_path(&words.remove(0))?,
        _ => NodePath::root(),
    };
    let query = words.join(" ");
    let rt = tokio::runtime::Runtime::new()?;
    let found = match &args.server {
        Some(url) => {
            let creds = super::login::credentials_for(url)?;
            let backend = RemoteBackend::new(creds.remote_config())?;
            rt.block_on(backend.search(&dir, &query, args.limit))
        }
        None => {
            let data_dir = args.data.path();
            let store = Store::open_local(&data_dir)
                .map_err(|e| format!("cannot open the store in {}: {e}", data_dir.display()))?;
            let store = Arc::new(store);
            let found = LocalBackend::new(store.clone());
            let found = rt.block_on(found.search(&dir, &query, args.limit));
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
        println!("{}", serde_json::to_string_pretty(&found)?);
        return Ok(());
    }
    for hit in &found.hits {
        let path = hit.uri.strip_prefix("/nodes/pth").unwrap_or(&hit.uri);
        println!("{path}\n    {}", hit.context);
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

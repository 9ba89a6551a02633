//! vaultfs: a document store as an ordinary folder.
//!
//! Layers, each using only those below it (DESIGN.md §1):
//! `cli` → `fs` / `server` → `backend` (the interface as async Rust calls; `local` over the
//! store, `remote` over HTTP) → `store` (the built-in implementation) → `api` (wire types).

pub mod api;
pub mod backend;
pub mod cli;
pub mod fs;
pub mod preview;
pub mod server;
pub mod store;

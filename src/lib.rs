//! vaultfs: a document store as an ordinary folder.
//!
//! # Layers
//!
//! Each module uses only the modules its row names, all of them lower in the table: no import
//! runs back up. This table is the one place the layers are written down (docs/design.md §1 draws the
//! same picture); the `layers` unit test reads it and fails, naming file, line and rule, when a
//! `crate::` path in the code goes anywhere else. Test code (`#[cfg(test)]` modules and files) is
//! not held to it.
//!
//! | module | what it is | uses |
//! |---|---|---|
//! | `cli` | the `vaultfs` command: assembles everything, so it opens the store itself (`serve`, `users`, a local mount) | `server`, `fs`, `backend`, `store`, `api`, `sync` |
//! | `server` | `vaultfs serve`: the interface over HTTP, over the local backend; the store for accounts, pins and tokens | `backend`, `store`, `api`, `sync` |
//! | `fs` | the mount: FUSE over any backend | `backend`, `api`, `sync` |
//! | `backend` | the interface as async Rust calls: `local` in process over the store, `remote` over HTTP | `store`, `api`, `sync` |
//! | `store` | the built-in implementation: metadata, blobs, versions, users, pins, tokens, previews kept | `preview`, `api`, `sync` |
//! | `preview` | rendering of previews: PNG pages and a PDF from a file's bytes, no I/O | `api` |
//! | `api` | wire types of the interface and what both sides need: paths, ranges, times, checksums, errors, secrets | `sync` |
//! | `sync` | `relock`: a mutex taken also after a panic poisoned it | |
//!
//! Known exceptions, each to be removed (the test also fails when one is no longer needed):
//! none.

pub mod api;
pub mod backend;
pub mod cli;
pub mod fs;
pub mod preview;
pub mod server;
pub mod store;
mod sync;

#[cfg(test)]
mod layers;

//! Staged bytes stored as the new version of the file at a path in one call (WebDAV's PUT):
//! the interface's upload steps, so as any save (quota, size limit, history and retention).

use crate::api::{Base, Error, ErrorKind, FileAttrs, Node, NodePath};
use crate::store::blobs::StagedBlob;
use crate::store::{Scope, Store};

/// A refused put: the error, and the bytes back when they were not used (the base refused at
/// step 2 or at the commit, among other errors), for the caller to store elsewhere.
pub type Refused = (Error, Option<Box<StagedBlob>>);

impl Store {
    /// Stores `staged` as the new version of the file at `path`: steps 1 and 2 in one
    /// transaction ([`Store::begin_version_at`]), then the commit. A new name is made unless
    /// `base` names a version (`Base::Md5`): then the file must exist, and is not made when it
    /// does not (`version_conflict`); a name made for bytes the commit then refuses is deleted
    /// again. `base` is checked again inside the commit (docs/design.md §5), so a stale one
    /// changes nothing.
    pub fn put_staged(
        &self,
        scope: Scope,
        path: &NodePath,
        staged: StagedBlob,
        base: &Base,
    ) -> std::result::Result<Node, Refused> {
        if path.name().is_none() {
            let root = Error::new(ErrorKind::Forbidden, "forbidden", "the root holds no files");
            return Err((root, Some(Box::new(staged))));
        }
        let attrs = FileAttrs::default();
        let begun = self.begin_version_at(scope, path, staged.len, Some(&staged.md5), attrs, base);
        let (pending, made) = match begun {
            Ok(begun) => begun,
            // A condition on the bytes of a file that is not there: it failed.
            Err(e) if e.kind == ErrorKind::NotFound && matches!(base, Base::Md5(_)) => {
                return Err((base.conflict(&path.to_string()), Some(Box::new(staged))));
            }
            Err(e) => return Err((e, Some(Box::new(staged)))),
        };
        let (Some(id), Some(vid)) = (
            pending.file_id(),
            pending.file_ex_properties.and_then(|p| p.version_id),
        ) else {
            return Err((Error::internal("step 2 gave no file or version"), None));
        };
        let stored = self.commit_or_back(scope, &id, &vid, staged);
        // A name made here for bytes then refused (quota, a conflict) does not stay behind,
        // empty: deleted while it still holds nothing (another writer's version stored in it
        // meanwhile stays).
        if stored.is_err() && made {
            let _ = self.delete_if(scope, path, &Base::Absent);
        }
        stored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another version committed between a put's step 2 and its commit refuses it, and its
    /// bytes come back whole: stored elsewhere, they are that file's.
    #[test]
    fn bytes_refused_at_the_commit_come_back() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local(&tmp.path().join("store")).unwrap();
        let vault = NodePath::from_segments(["Local", "My First Vault"]).unwrap();
        let (a, b) = (vault.child("a.txt").unwrap(), vault.child("b.txt").unwrap());
        let staged = |bytes: &'static [u8]| {
            let mut w = store.blob_writer().unwrap();
            w.write(bytes::Bytes::from_static(bytes)).unwrap();
            w.finish().unwrap()
        };
        let one = store
            .put_staged(Scope::All, &a, staged(b"one"), &Base::Any)
            .unwrap();
        let base = Base::Md5(one.md5_checksum.unwrap());
        let attrs = FileAttrs::default();
        let (pending, _) = store
            .begin_version_at(Scope::All, &a, 3, None, attrs, &base)
            .unwrap();
        let two = store
            .put_staged(Scope::All, &a, staged(b"two"), &Base::Any)
            .unwrap();
        let (id, vid) = (
            pending.file_id().unwrap(),
            pending.file_ex_properties.unwrap().version_id.unwrap(),
        );
        let new = staged(b"new");
        let md5 = new.md5.clone();
        let (e, back) = store
            .commit_or_back(Scope::All, &id, &vid, new)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Precondition);
        let kept = store
            .put_staged(Scope::All, &b, *back.unwrap(), &Base::Absent)
            .unwrap();
        assert_eq!(kept.md5_checksum, Some(md5));
        let at_a = store.node(Scope::All, &a).unwrap();
        assert_eq!(at_a.md5_checksum, two.md5_checksum);
    }
}

//! `vaultfs link FILE`: the browser link of a file in a mount, for pasting into a mail; read
//! from the `user.vaultfs.*link_uri` attributes the mount gives every file (`getfattr -d`
//! shows them too).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::Args;

use super::mounted::Mounted;
use super::terminal;
use crate::fs::status::StoreAt;

#[derive(Args)]
pub struct LinkArgs {
    /// A file in a vaultfs mount
    file: PathBuf,
    /// The link to its preview instead
    #[arg(long, conflicts_with = "download")]
    preview: bool,
    /// The link that downloads it instead
    #[arg(long)]
    download: bool,
}

/// The value of extended attribute `name` of `path` (None: the file has none of that name).
fn xattr(path: &std::path::Path, name: &str) -> std::io::Result<Option<String>> {
    let p = CString::new(path.as_os_str().as_bytes())?;
    let n = CString::new(name)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: both strings are NUL-terminated; the buffer's length is passed with it.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ => Err(e),
        };
    }
    buf.truncate(len as usize);
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

pub fn link(args: LinkArgs) -> Result<(), Box<dyn std::error::Error>> {
    let name = if args.preview {
        "user.vaultfs.preview_link_uri"
    } else if args.download {
        "user.vaultfs.download_link_uri"
    } else {
        "user.vaultfs.link_uri"
    };
    let shown = terminal::escaped(&args.file.display().to_string());
    // Only a vaultfs mount's attribute is its link: any file elsewhere can carry one, set by
    // whoever wrote it.
    let Some(mounted) = Mounted::of(&args.file)? else {
        return Err(format!("{shown}: not in a vaultfs mount").into());
    };
    let uri = match xattr(&args.file, name) {
        Ok(Some(uri)) => uri,
        Ok(None) => {
            return Err(format!(
                "{shown}: no link (a folder, a file not yet stored, or a store without browser \
                 links)"
            )
            .into());
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
            return Err(format!("{shown}: not in a vaultfs mount ({e})").into());
        }
        Err(e) => return Err(format!("{shown}: {e}").into()),
    };
    // What the store sent, printed only as a web address: one relative to the server the mount
    // uses is made absolute against it, anything else (another scheme, escape sequences that
    // would set the clipboard or clear the screen) is refused.
    let server = match &mounted.store {
        StoreAt::Server(url) => Some(url.as_str()),
        StoreAt::DataDir(_) => None,
    };
    let url =
        terminal::web_url(server, &uri).map_err(|e| format!("{shown}: the store's link is {e}"))?;
    println!("{url}");
    Ok(())
}

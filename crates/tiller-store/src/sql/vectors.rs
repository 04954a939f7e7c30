//! sqlite-vec, compiled in: SQLite ranks facts' embeddings itself
//! (`vec_distance_cosine` over the `embedding` column, a BLOB of
//! little-endian `f32`s), brute force over one user's facts.

// The one use of unsafe code in the store: handing SQLite the extension's entry
// point, as its C API asks.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

use libsqlite3_sys::{sqlite3, sqlite3_api_routines, sqlite3_auto_extension};

/// The C signature of an SQLite extension's entry point.
type EntryPoint =
    unsafe extern "C" fn(*mut sqlite3, *mut *mut c_char, *const sqlite3_api_routines) -> c_int;

/// Registers sqlite-vec for every SQLite connection the process opens from now
/// on (SQLite's auto-extensions: sqlx's `Any` pool has no per-connection
/// hook). Once per process; connections opened before are left as they are.
/// SQLite's error code when it could not.
pub(super) fn register() -> Result<(), c_int> {
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    let code = *REGISTERED.get_or_init(|| {
        // SAFETY: `sqlite3_vec_init` is the extension's entry point, whose C
        // signature is `EntryPoint` (the crate declares it without arguments);
        // SQLite calls it with a new connection, as an extension expects.
        let entry = unsafe {
            std::mem::transmute::<*const (), EntryPoint>(sqlite_vec::sqlite3_vec_init as *const ())
        };
        // SAFETY: registers a valid entry point; SQLite keeps the list itself.
        unsafe { sqlite3_auto_extension(Some(entry)) }
    });
    match code {
        0 => Ok(()),
        code => Err(code),
    }
}

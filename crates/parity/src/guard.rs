//! The last line of defence: a panic while checking one bundle becomes an "internal error"
//! for that bundle (exit code 2, one line) instead of a crash that loses every other result.
//! No known input panics; the fuzz targets in `fuzz/` and the property tests look for them.

use crate::error::{ParityError, Result};
use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Once;

thread_local! {
    /// `Some` while this thread runs inside [`catch`]: the hook stores the panic's message here
    /// instead of printing it.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Install (once per process) a panic hook that stays quiet for panics inside [`catch`] and
/// hands every other panic to the hook that was there before.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let inside = CAUGHT.with(|c| {
                let mut c = c.borrow_mut();
                match c.as_mut() {
                    Some(slot) => {
                        let payload = info
                            .payload()
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| info.payload().downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        let at = info
                            .location()
                            .map(|l| format!(" at {}:{}", l.file(), l.line()))
                            .unwrap_or_default();
                        *slot = format!("panic{at}: {payload}");
                        true
                    }
                    None => false,
                }
            });
            if !inside {
                previous(info);
            }
        }));
    });
}

/// Run `f`; a panic inside it is returned as [`ParityError::Internal`] for `path`.
pub fn catch<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    install_hook();
    let outer = CAUGHT.with(|c| c.borrow_mut().replace(String::new()));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    let message = CAUGHT.with(|c| std::mem::replace(&mut *c.borrow_mut(), outer));
    result.unwrap_or_else(|_| {
        Err(ParityError::Internal {
            path: path.to_path_buf(),
            message: message.filter(|m| !m.is_empty()).unwrap_or_else(|| "panic".into()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_error_and_nested_calls_work() {
        let r: Result<()> = catch(Path::new("x.safetensors"), || panic!("boom\nsecond line"));
        let e = r.unwrap_err().to_string();
        assert!(e.starts_with("x.safetensors: internal error"), "{e}");
        assert!(e.contains("boom\\nsecond line") && !e.contains('\n'), "{e}");
        let ok = catch(Path::new("y"), || catch(Path::new("z"), || Ok(3)));
        assert_eq!(ok.unwrap(), 3);
    }
}

package supervisor

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/policy"
	"github.com/airlockhq/airlock/ui"
)

// Reload re-reads the config file and brings the config's sandboxes up,
// down or anew (a changed subnet or policy path) to match, and re-reads the
// policy file of every sandbox that stays. A config that does not parse,
// or whose sandboxes clash with API-made ones, changes nothing. A policy
// file that does not parse keeps its sandbox's last good policy. Settings
// other than the sandboxes need a restart; Restart lists those that
// changed. It implements ui.Manager.
func (d *Daemon) Reload() (ui.ReloadResult, error) {
	d.notify("RELOADING=1\nSTATUS=reloading " + d.cfgPath)
	res, err := d.reload()
	if err != nil {
		d.log.Error("reload refused; the running config stays in force", "config", d.cfgPath, "err", err)
	} else {
		for _, e := range res.Errors {
			d.log.Error("reload: refused", "err", e)
		}
		d.log.Info("reloaded", "config", d.cfgPath, "added", res.Added, "removed", res.Removed, "changed", res.Changed,
			"policies", len(res.Reloaded), "errors", len(res.Errors), "restart_needed", res.Restart)
	}
	d.notify("READY=1\nSTATUS=" + d.Status())
	return res, err
}

func (d *Daemon) reload() (ui.ReloadResult, error) {
	res := ui.ReloadResult{Added: []string{}, Removed: []string{}, Changed: []string{}, Reloaded: []string{}, Widened: []string{}, Errors: []string{}, Restart: []string{}}
	next, err := LoadConfig(d.cfgPath, d.cfgExplicit)
	if err != nil {
		return res, &ui.ManagerError{Msg: err.Error(), Hint: "the running config stays in force; fix the file and reload again"}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// API-made sandboxes stay; the config's must not clash with them.
	probe := *next
	for _, s := range d.sandboxes {
		if !s.fromAPI {
			continue
		}
		if _, err := probe.NewSandbox(s.cfg.Name, s.cfg.Policy, s.cfg.Subnet.String(), ""); err != nil {
			return res, &ui.ManagerError{Msg: fmt.Sprintf("config %s clashes with API-made sandbox %s: %v", next.Path, s.cfg.Name, err),
				Hint: "the running config stays in force; pick another name or subnet, or delete the API-made sandbox first", Conflict: true}
		}
	}
	res.Restart = restartKeys(d.cfg, next)

	var configured []config.Sandbox
	for _, s := range d.sandboxes {
		if !s.fromAPI {
			configured = append(configured, s.cfg)
		}
	}
	p := plan(configured, next.Sandboxes)
	changes := map[string]config.Sandbox{}
	for _, sb := range slices.Concat(p.Restart, p.Replace) {
		changes[sb.Name] = sb
	}
	var toStart []config.Sandbox
	// Down first, so that a subnet freed by one sandbox can go to another.
	for i := 0; i < len(d.sandboxes); {
		s := d.sandboxes[i]
		sb, changed := changes[s.cfg.Name]
		switch {
		case s.fromAPI || !changed && !slices.Contains(p.Remove, s.cfg.Name):
			i++
			continue
		case changed:
			// A new policy file that does not parse leaves the sandbox as it
			// runs; the next reload tries again.
			nextPolicy, err := policy.OpenSandbox(policy.SandboxConfig{Name: sb.Name, Path: sb.Policy})
			if err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("sandbox %s left as it runs: %v", sb.Name, err))
				i++
				continue
			}
			// Pointing a sandbox at another policy file is an edit of its
			// policy like any other: what it widens is said (design §8,
			// invariant 15).
			before, after := s.policy.Spec(), nextPolicy.Spec()
			if w := widenedBy(s.cfg, sb, &before, &after); w != "" {
				res.Widened = append(res.Widened, w)
				d.log.Warn("reload: the sandbox's new config widens access; applied", "sandbox", sb.Name, "policy", sb.Policy, "widens", w)
			}
			res.Changed = append(res.Changed, s.cfg.Name)
			if slices.Contains(p.Restart, sb) {
				// Same network: restart its services on the bridge that
				// stays, so members keep their place on it.
				s.stop(d.log)
				ns, err := d.startSandboxLocked(sb, false)
				if err == nil {
					d.sandboxes[i] = ns
					d.byName.Store(ns.cfg.Name, ns)
					i++
					continue
				}
				res.Errors = append(res.Errors, fmt.Sprintf("sandbox %s: %v", sb.Name, err))
				res.Changed = slices.DeleteFunc(res.Changed, func(n string) bool { return n == sb.Name })
				res.Removed = append(res.Removed, sb.Name)
				break // and down it goes
			}
			toStart = append(toStart, sb)
		default:
			res.Removed = append(res.Removed, s.cfg.Name)
		}
		if err := d.removeSandboxLocked(i); err != nil {
			// Its rules stay, so it stays closed.
			res.Errors = append(res.Errors, fmt.Sprintf("sandbox %s: stop: %v", s.cfg.Name, err))
			i++
		}
	}
	for _, s := range d.sandboxes {
		if slices.Contains(res.Changed, s.cfg.Name) {
			continue // just started with its new policy file
		}
		s.policyFP = fingerprintOf(s.cfg.Policy)
		before := s.policy.Spec()
		if err := s.policy.Reload(); err != nil {
			res.Errors = append(res.Errors, err.Error())
			continue
		}
		res.Reloaded = append(res.Reloaded, s.cfg.Name)
		after := s.policy.Spec()
		// Put in force by Reload already (OnResources); asked again to
		// report a limit the kernel refused.
		if err := d.setBandwidth(s, after.Resources.BandwidthMbps); err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
		if why := policy.Widens(&before, &after); len(why) > 0 {
			res.Widened = append(res.Widened, s.cfg.Name+": "+strings.Join(why, "; "))
			d.log.Warn("reload: policy file widens access; applied", "sandbox", s.cfg.Name, "policy", s.cfg.Policy, "widens", why)
		}
		s.held = nil
	}
	for _, sb := range p.Add {
		res.Added = append(res.Added, sb.Name)
		toStart = append(toStart, sb)
	}
	for _, sb := range toStart {
		if _, err := d.addSandboxLocked(sb, false); err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("sandbox %s: %v", sb.Name, err))
			res.Added = slices.DeleteFunc(res.Added, func(n string) bool { return n == sb.Name })
			res.Changed = slices.DeleteFunc(res.Changed, func(n string) bool { return n == sb.Name })
		}
	}
	cfg := *d.cfg
	cfg.Path, cfg.Sandboxes = next.Path, next.Sandboxes
	d.cfg = &cfg
	return res, nil
}

// reloadPlan is what a reload does to the sandboxes of the config, worked
// out from the running config and the next one before anything changes.
// API-made sandboxes are not in it: a reload leaves them running.
type reloadPlan struct {
	// Keep run on as they are; their policy files are read again.
	Keep []string
	// Restart get another policy file on the same subnet: their services
	// restart on the bridge that stays, so members keep their place.
	Restart []config.Sandbox
	// Replace move to another subnet: down, then up.
	Replace []config.Sandbox
	// Remove are no longer in the config.
	Remove []string
	// Add are new in the config, in its order.
	Add []config.Sandbox
}

// plan compares the running config sandboxes with the next config's.
func plan(running, next []config.Sandbox) reloadPlan {
	var p reloadPlan
	wanted := map[string]config.Sandbox{}
	for _, sb := range next {
		wanted[sb.Name] = sb
	}
	runs := map[string]bool{}
	for _, r := range running {
		runs[r.Name] = true
		sb, ok := wanted[r.Name]
		switch {
		case !ok:
			p.Remove = append(p.Remove, r.Name)
		case sb == r:
			p.Keep = append(p.Keep, r.Name)
		case sb.Subnet == r.Subnet:
			p.Restart = append(p.Restart, sb)
		default:
			p.Replace = append(p.Replace, sb)
		}
	}
	for _, sb := range next {
		if !runs[sb.Name] {
			p.Add = append(p.Add, sb)
		}
	}
	return p
}

// widenedBy says what a sandbox's new config (another policy file, another
// subnet) widens over the policy in force, as the reload result lists it,
// or "" when it widens nothing.
func widenedBy(run, next config.Sandbox, before, after *policy.Spec) string {
	why := policy.Widens(before, after)
	if len(why) == 0 {
		return ""
	}
	w := next.Name + ": "
	if run.Policy != next.Policy {
		w += fmt.Sprintf("policy file %s → %s: ", run.Policy, next.Policy)
	}
	return w + strings.Join(why, "; ")
}

// restartKeys lists the settings that differ between the running config
// and next, other than the sandboxes: they take effect on a restart.
func restartKeys(run, next *config.Config) []string {
	var out []string
	for _, k := range []struct {
		key  string
		same bool
	}{
		{"api_listen", run.APIListen == next.APIListen},
		{"state_dir", run.StateDir == next.StateDir},
		{"run_dir", run.RunDir == next.RunDir},
		{"upstream_dns", slices.Equal(run.UpstreamDNS, next.UpstreamDNS)},
		{"upstream_ca_file", run.UpstreamCAFile == next.UpstreamCAFile},
		{"fake_ip_pool", run.FakeIPPool == next.FakeIPPool},
		{"proxy_port", run.ProxyPort == next.ProxyPort},
		{"exfil", run.Exfil == next.Exfil},
		{"log_allowed", run.LogAllowed == next.LogAllowed},
		{"policy_poll_seconds", run.PolicyPoll == next.PolicyPoll},
		{"drain_seconds", run.Drain == next.Drain},
		{"expose_listen", run.ExposeListen == next.ExposeListen},
	} {
		if !k.same {
			out = append(out, k.key)
		}
	}
	return out
}

// fingerprint identifies a policy file's content: a change of size,
// modification time or bytes changes it. A missing file has its own, and
// so does a file that cannot be read (its error), which still changes with
// the file's size and modification time.
type fingerprint struct {
	size  int64
	mtime time.Time
	sum   [sha256.Size]byte
	state string // "missing", "error: …", or "" for a file read
}

// fingerprintOf reads the policy file as the loader does (policy.ReadFile:
// a sandbox member may control it, so nothing that is not a regular file,
// never blocking, never more than policy.MaxFileSize+1 bytes); the poll
// then hands a changed file to the loader, which refuses a bad one and
// keeps the last good policy.
func fingerprintOf(path string) fingerprint {
	b, info, err := policy.ReadFile(path)
	var fp fingerprint
	if info != nil {
		fp.size, fp.mtime = info.Size(), info.ModTime()
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fingerprint{state: "missing"}
	case err != nil:
		fp.state = "error: " + err.Error()
		return fp
	}
	fp.sum = sha256.Sum256(b)
	return fp
}

// watchPolicies re-reads a sandbox's policy file when it changes on disk
// (an edit by hand, a git checkout), every interval, until stop is closed.
// An edit that only restricts access is put in force. An edit that widens
// it (see policy.Widens) is not: a sandbox member may be able to write the
// file, so only a person's explicit reload applies it; the change is
// logged once, with what widens, and shown in the status line. A file that
// does not parse is refused with its file and line, once per change. In
// both cases the policy in force stays.
func (d *Daemon) WatchPolicies(interval time.Duration, stop <-chan struct{}) {
	every(interval, stop, func() {
		d.mu.Lock()
		running := slices.Clone(d.sandboxes)
		d.mu.Unlock()
		// Files are read without the lock: a slow disk must not hold up
		// the API or a reload.
		for _, s := range running {
			fp := fingerprintOf(s.cfg.Policy)
			d.mu.Lock()
			changed := fp != s.policyFP && slices.Contains(d.sandboxes, s)
			if changed {
				s.policyFP = fp
			}
			d.mu.Unlock()
			if !changed {
				continue
			}
			err := s.policy.ReloadRestricting()
			var we *policy.WidensError
			if errors.As(err, &we) {
				d.log.Warn("policy file widens access; run `airlock reload` (or SIGHUP) to apply it", "sandbox", s.cfg.Name,
					"policy", s.cfg.Policy, "widens", we.Reasons)
				d.setHeld(s, we.Reasons)
				continue
			}
			if err != nil {
				d.log.Error("policy file changed but refused; the last good policy stays in force", "sandbox", s.cfg.Name, "err", err)
				continue
			}
			d.setHeld(s, nil)
			d.log.Info("policy file changed; reloaded", "sandbox", s.cfg.Name, "policy", s.cfg.Policy, "rules", len(s.policy.Rules()))
		}
	})
}

// every calls f every interval until stop is closed.
func every(interval time.Duration, stop <-chan struct{}, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			f()
		}
	}
}

// setHeld records the widening edit of s's policy file that a poll kept
// out of force (nil: none), and tells systemd when that changes.
func (d *Daemon) setHeld(s *sandbox, why []string) {
	d.mu.Lock()
	changed := !slices.Equal(s.held, why)
	s.held = why
	d.mu.Unlock()
	if changed {
		d.notify("STATUS=" + d.Status())
	}
}

// status is the one-line state systemd shows in `systemctl status`.
func (d *Daemon) Status() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, len(d.sandboxes))
	var held []string
	for i, s := range d.sandboxes {
		names[i] = s.cfg.Name
		if len(s.held) > 0 {
			held = append(held, s.cfg.Name)
		}
	}
	if len(names) == 0 {
		names = []string{"none"}
	}
	st := fmt.Sprintf("sandboxes: %s; API %s", strings.Join(names, ", "), APIURL(d.cfg.APIListen))
	if len(held) > 0 {
		st += "; policy edits that widen access wait for airlock reload: " + strings.Join(held, ", ")
	}
	return st
}

// watchdog tells systemd the daemon is alive every interval, until stop is
// closed. A daemon stuck holding its lock stops the pings, and systemd
// restarts it.
func (d *Daemon) Watchdog(interval time.Duration, stop <-chan struct{}) {
	every(interval, stop, func() {
		// Taking the lock proves nothing holds it for good.
		d.mu.Lock()
		d.mu.Unlock()
		d.notify("WATCHDOG=1")
	})
}

package supervisor

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/tproxy"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// LoadConfig reads the config file at path; without an explicit path, a
// missing file means the built-in config.
func LoadConfig(path string, explicit bool) (*config.Config, error) {
	cfg, err := config.Load(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return config.Default(), nil
	}
	return cfg, err
}

// upstreamRoots are the system roots plus the certificates in file (the
// config's upstream_ca_file), which verify upstream TLS when intercepting.
func upstreamRoots(file string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if file == "" {
		return pool, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("upstream_ca_file: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("upstream_ca_file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// Teardown removes the table, the bridges of configured sandboxes and of
// any sandbox the table still names, and the leases.
func Teardown(cfg *config.Config) error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	bridges := map[string]bool{}
	for _, sb := range cfg.Sandboxes {
		bridges[netns.BridgeName(sb.Name)] = true
	}
	for _, b := range tproxy.TableBridges(conn) {
		bridges[b] = true
	}
	var errs []error
	// Docker networks first: one left behind would bring its bridge back,
	// without rules, when a container joins it.
	if dk, err := netns.ConnectDocker(context.Background(), slog.New(slog.DiscardHandler)); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := dk.RemoveOthers(ctx)
		cancel()
		dk.Close()
		if err != nil {
			return fmt.Errorf("rules kept because a sandbox's Docker network could not be removed: %w", err)
		}
	}
	// Bridges next: a bridge without rules would be open. If one cannot
	// be removed, the rules stay.
	for b := range bridges {
		if err := netns.DeleteBridge(h, b); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("rules kept because a bridge could not be removed: %w", errors.Join(errs...))
	}
	if err := tproxy.DeleteRules(conn); err != nil {
		errs = append(errs, err)
	}
	if err := netns.DeleteDivertRouting(h); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(filepath.Join(cfg.RunDir, "leases")); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

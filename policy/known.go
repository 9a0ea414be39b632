package policy

import (
	"strings"
	"time"
)

var timeZero time.Time

// LLMProvider is an LLM API airlock knows. Traffic to it is flagged so the
// monitor can show or hide it.
type LLMProvider struct {
	Name string
	Host string
}

// LLMProviders are the LLM APIs airlock knows.
var llmProviders = []LLMProvider{
	{Name: "Google Gemini", Host: "generativelanguage.googleapis.com"},
	{Name: "Anthropic", Host: "api.anthropic.com"},
	{Name: "OpenAI", Host: "api.openai.com"},
	{Name: "Groq", Host: "api.groq.com"},
}

// LLMProviders returns the LLM APIs airlock knows.
func LLMProviders() []LLMProvider {
	return append([]LLMProvider(nil), llmProviders...)
}

// IsLLMHost reports whether host (normalised) is a known LLM provider's API.
func IsLLMHost(host string) bool {
	for _, p := range llmProviders {
		if p.Host == host {
			return true
		}
	}
	return false
}

// Risk rates how much an MCP server can reach.
type Risk uint8

const (
	RiskNone Risk = iota + 1
	RiskLow
	RiskMedium
	RiskHigh
)

func (r Risk) String() string {
	switch r {
	case RiskNone:
		return "none"
	case RiskLow:
		return "low"
	case RiskMedium:
		return "medium"
	case RiskHigh:
		return "high"
	}
	return "unknown"
}

// Network says what an MCP server needs to reach.
type Network uint8

const (
	// NetworkNone: the server works offline.
	NetworkNone Network = iota + 1
	// NetworkDomains: the server talks to the fixed domains in Domains.
	NetworkDomains
	// NetworkAnyURL: the server fetches whatever URL it is asked for; nothing
	// is allowed for it automatically.
	NetworkAnyURL
)

func (n Network) String() string {
	switch n {
	case NetworkNone:
		return "none"
	case NetworkDomains:
		return "domains"
	case NetworkAnyURL:
		return "any-url"
	}
	return "unknown"
}

// KnownMCPServer describes an MCP server airlock knows.
type KnownMCPServer struct {
	Name      string
	Transport string // the transport it usually runs with
	Network   Network
	// Domains are allowed automatically (tier auto) for a sandbox that lists
	// the server in mcp_servers.
	Domains []string
	Risk    Risk
}

var knownMCPServers = []KnownMCPServer{
	{Name: "filesystem", Transport: "stdio", Network: NetworkNone, Risk: RiskLow},
	{Name: "time", Transport: "stdio", Network: NetworkNone, Risk: RiskNone},
	{Name: "sqlite", Transport: "stdio", Network: NetworkNone, Risk: RiskLow},
	{Name: "memory", Transport: "stdio", Network: NetworkNone, Risk: RiskLow},
	{Name: "github", Transport: "stdio", Network: NetworkDomains, Domains: []string{"api.github.com", "github.com"}, Risk: RiskMedium},
	{Name: "gitlab", Transport: "stdio", Network: NetworkDomains, Domains: []string{"gitlab.com"}, Risk: RiskMedium},
	{Name: "slack", Transport: "stdio", Network: NetworkDomains, Domains: []string{"slack.com", "api.slack.com"}, Risk: RiskMedium},
	{Name: "google-drive", Transport: "stdio", Network: NetworkDomains, Domains: []string{"*.googleapis.com"}, Risk: RiskMedium},
	{Name: "brave-search", Transport: "stdio", Network: NetworkDomains, Domains: []string{"api.search.brave.com"}, Risk: RiskMedium},
	{Name: "fetch", Transport: "stdio", Network: NetworkAnyURL, Risk: RiskHigh},
	{Name: "puppeteer", Transport: "stdio", Network: NetworkAnyURL, Risk: RiskHigh},
	{Name: "browserbase", Transport: "stdio", Network: NetworkAnyURL, Risk: RiskHigh},
}

// KnownMCPServers returns the MCP servers airlock knows.
func KnownMCPServers() []KnownMCPServer {
	out := make([]KnownMCPServer, len(knownMCPServers))
	for i, s := range knownMCPServers {
		s.Domains = append([]string(nil), s.Domains...)
		out[i] = s
	}
	return out
}

// LookupMCPServer returns the known MCP server with this name (case
// insensitive).
func LookupMCPServer(name string) (KnownMCPServer, bool) {
	name = strings.ToLower(strings.TrimSpace(name))
	for _, s := range knownMCPServers {
		if s.Name == name {
			s.Domains = append([]string(nil), s.Domains...)
			return s, true
		}
	}
	return KnownMCPServer{}, false
}

// MCPAutoRules returns the auto allow rules that known MCP servers in servers
// bring: their domains, with source "mcp:NAME". Unknown servers bring none.
func MCPAutoRules(servers []MCPServer) []*Rule {
	var rules []*Rule
	for _, srv := range servers {
		k, ok := LookupMCPServer(srv.Name)
		if !ok {
			continue
		}
		for _, d := range k.Domains {
			rules = append(rules, NewRule(Allowlist, Auto, MustParse(d), "", "mcp:"+k.Name, timeZero))
		}
	}
	return rules
}

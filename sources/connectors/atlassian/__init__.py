"""What Jira and Confluence share: the Atlassian REST client and the site/credential config."""
